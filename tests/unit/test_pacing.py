"""The token bucket of ``max-delivery-rate`` (sidecar/engine/pacing.py) against a plain model in
exact fractions, and the rate bound it exists for, on sequences hypothesis makes."""

from __future__ import annotations

from fractions import Fraction
from math import ceil, floor
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.engine.pacing import Pacing, TokenBucket


class Model:
    """Tokens as a fraction: + rate per second up to the burst, - 1 per record."""

    def __init__(self, rate: Fraction, burst: int) -> None:
        self.rate, self.burst, self.tokens, self.at = rate, Fraction(burst), Fraction(burst), 0

    def fill(self, now: int) -> None:
        if now > self.at:
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate / 1000)
            self.at = now

    def available(self, now: int) -> int:
        self.fill(now)
        return floor(self.tokens)

    def next_ms(self, now: int) -> int:
        """The first whole ms at which a token is there."""
        self.fill(now)
        return now if self.tokens >= 1 else now + ceil((1 - self.tokens) * 1000 / self.rate)


steps = st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 50)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(rate_milli=st.integers(1, 5_000_000), burst=st.integers(1, 40), steps=steps)
def test_the_bucket_matches_the_model_and_never_exceeds_its_rate(
        rate_milli: int, burst: int, steps: list[tuple[int, int]]) -> None:
    bucket = TokenBucket(rate_milli / 1000, 0, burst)
    model = Model(Fraction(rate_milli, 1000), burst)
    now = 0
    taken: list[tuple[int, int]] = []
    for gap, want in steps:
        now += gap
        avail = bucket.available(now)
        assert avail == model.available(now)
        if avail == 0:
            assert bucket.next_ms(now) == model.next_ms(now)
        n = min(want, avail)
        bucket.take(n, now)
        model.tokens -= n
        taken.append((now, n))
    # whatever was asked, any window [t0, t1] holds at most burst + rate x (t1 - t0) handed out
    for i, (t0, _n) in enumerate(taken):
        total = 0
        for t1, n in taken[i:]:
            total += n
            assert total <= burst + Fraction(rate_milli, 1000) * (t1 - t0) / 1000


@given(rate_milli=st.integers(1, 1_000_000), burst=st.integers(2, 10), horizon=st.integers(0, 20_000))
def test_a_bucket_drained_at_each_next_token_hands_out_its_rate(rate_milli: int, burst: int, horizon: int) -> None:
    """Taken whenever a token is there: over ``t`` ms, the burst plus ``rate x t``, within one record
    (a burst of two: the credit one ms adds beyond a full bucket of one would be lost)."""
    bucket = TokenBucket(rate_milli / 1000, 0, burst)
    now = total = 0
    while True:
        total += bucket.available(now)
        bucket.take(bucket.available(now), now)
        nxt = bucket.next_ms(now)
        if nxt > horizon:
            break
        assert nxt > now
        now = nxt
    expect = burst + Fraction(rate_milli, 1000) * horizon / 1000
    assert expect - 1 < total <= expect


def _tenant(name: str, rate: float | None) -> SimpleNamespace:
    return SimpleNamespace(name=name, ingress_topic=f"{name}.in", max_delivery_rate=rate)


def test_pacing_caps_only_the_paced_tenant_and_wakes_at_its_next_token() -> None:
    p = Pacing([_tenant("a", 10.0), _tenant("b", None)], 0)
    assert p.room("b.in", 1000, 0) == 1000
    assert p.room("a.in", 1000, 0) == 2  # burst: 0.1 s of 10/s, at least two
    p.took("a.in", [(0, SimpleNamespace(due_ms=-300))], 0)
    p.took("a.in", [(0, SimpleNamespace(due_ms=-250))], 0)
    assert p.room("a.in", 1000, 0) == 0
    assert p.lag_s == {"a": 0.25}
    assert p.wake("a.in", -250, 0) == 100  # due, but its next token comes in 100 ms
    assert p.wake("a.in", 500, 0) == 500
    assert p.wake("b.in", -250, 0) == -250
    assert p.room("a.in", 1000, 100) == 1
