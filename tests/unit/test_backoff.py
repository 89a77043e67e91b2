"""Backoff: property tests against a reference model written with exact integer arithmetic."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.retry import Backoff

bases = st.integers(min_value=0, max_value=10_000)
caps = st.integers(min_value=0, max_value=10**9)
int_factors = st.integers(min_value=1, max_value=10)
float_factors = st.floats(min_value=1.0, max_value=10.0, allow_nan=False)
attempts = st.integers(min_value=1, max_value=200)


def reference_ceiling(base: int, cap: int, factor: Fraction, attempt: int) -> int:
    """min(cap, floor(base * factor ** (attempt - 1))), exactly, by repeated multiplication."""
    value = Fraction(base)
    for _ in range(attempt - 1):
        if value >= cap:
            break
        value *= factor
    return min(cap, int(value))


@given(bases, caps, int_factors, attempts)
def test_ceiling_matches_reference_for_integral_factors(
    base: int, cap: int, factor: int, attempt: int
) -> None:
    b = Backoff(base_ms=base, cap_ms=cap, factor=float(factor))
    # Integral factors keep every power below 2**53 exact in binary floating point up to the cap.
    assert b.ceiling_ms(attempt) == reference_ceiling(base, cap, Fraction(factor), attempt)


@given(bases, caps, float_factors, attempts)
def test_ceiling_close_to_reference_for_any_factor(base: int, cap: int, factor: float, attempt: int) -> None:
    b = Backoff(base_ms=base, cap_ms=cap, factor=factor)
    expected = reference_ceiling(base, cap, Fraction(factor), attempt)
    got = b.ceiling_ms(attempt)
    assert 0 <= got <= cap
    # float pow rounds; allow one ulp-ish of relative error, never past the cap
    assert abs(got - expected) <= max(1, expected * 1e-12)


@given(bases, caps, float_factors, attempts)
def test_ceiling_is_monotone_and_capped(base: int, cap: int, factor: float, attempt: int) -> None:
    b = Backoff(base_ms=base, cap_ms=cap, factor=factor)
    assert b.ceiling_ms(attempt) <= b.ceiling_ms(attempt + 1) <= cap


@given(bases, caps, float_factors, attempts, st.integers(min_value=0, max_value=2**32))
def test_delay_within_bounds(base: int, cap: int, factor: float, attempt: int, seed: int) -> None:
    b = Backoff(base_ms=base, cap_ms=cap, factor=factor)
    d = b.delay_ms(attempt, random.Random(seed))
    assert isinstance(d, int)
    assert 0 <= d <= b.ceiling_ms(attempt) <= cap


@given(bases, caps, float_factors, st.integers(min_value=0, max_value=2**32))
def test_deterministic_for_seeded_rng(base: int, cap: int, factor: float, seed: int) -> None:
    b = Backoff(base_ms=base, cap_ms=cap, factor=factor)
    r1, r2 = random.Random(seed), random.Random(seed)
    assert [b.delay_ms(n, r1) for n in range(1, 30)] == [b.delay_ms(n, r2) for n in range(1, 30)]


@given(st.integers(min_value=1, max_value=10_000), float_factors)
def test_no_overflow_for_huge_attempts(base: int, factor: float) -> None:
    b = Backoff(base_ms=base, cap_ms=30_000, factor=factor)
    for attempt in (1_000, 10_000, 10**6, 10**100, 10**400):
        c = b.ceiling_ms(attempt)
        assert 0 <= c <= 30_000
        if factor >= 1.01:
            assert c == 30_000
        assert 0 <= b.delay_ms(attempt, random.Random(attempt)) <= 30_000


def test_defaults_and_attempt_10_000() -> None:
    b = Backoff()
    assert (b.base_ms, b.cap_ms, b.factor) == (100, 30_000, 2.0)
    assert [b.ceiling_ms(n) for n in range(1, 11)] == [
        100, 200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30_000,
    ]
    assert b.ceiling_ms(10_000) == 30_000
    rng = random.Random(7)
    delays = [b.delay_ms(10_000, rng) for _ in range(2000)]
    assert min(delays) >= 0 and max(delays) <= 30_000
    # full jitter: the whole window is used, not just its upper half
    assert min(delays) < 3_000 and max(delays) > 27_000


def test_full_jitter_includes_both_ends() -> None:
    class Extremes:
        def __init__(self, pick_high: bool) -> None:
            self.pick_high = pick_high

        def randint(self, a: int, b: int) -> int:
            return b if self.pick_high else a

    b = Backoff(base_ms=100, cap_ms=1000)
    assert b.delay_ms(3, Extremes(True)) == 400
    assert b.delay_ms(3, Extremes(False)) == 0


def test_factor_one_is_constant() -> None:
    b = Backoff(base_ms=250, cap_ms=1000, factor=1.0)
    assert {b.ceiling_ms(n) for n in (1, 2, 50, 10**9)} == {250}


@pytest.mark.parametrize(
    "kwargs",
    [{"base_ms": -1}, {"cap_ms": -1}, {"factor": 0.5}, {"factor": float("nan")}],
)
def test_rejects_bad_parameters(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Backoff(**kwargs)  # type: ignore[arg-type]


def test_attempt_is_one_based() -> None:
    with pytest.raises(ValueError):
        Backoff().ceiling_ms(0)
