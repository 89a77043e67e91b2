"""Pacing: a tenant's ``max-delivery-rate`` (records/s), a token bucket per tenant.

:class:`TokenBucket` is pure (the clock reading is passed in): it holds up to ``burst`` tokens and
gains ``rate`` per second; handing out a record takes one. The arithmetic is in integers, so that
a long run cannot drift: the rate is kept in thousandths of a record per second (``rate_milli``),
and the credit in millionths of a record, of which one millisecond adds ``rate_milli``. Over any
interval of ``t`` ms a bucket hands out at most ``burst + rate * t / 1000`` records
(``tests/unit/test_pacing.py`` checks it against a plain model with hypothesis). The burst is
``BURST_S`` seconds of the rate (at least two records: a full bucket of one would lose the part of
a token the last millisecond added, and hand out 1 per ``ceil(1000 / rate)`` ms): what one
publish turn may hand out at once after an idle spell.

:class:`Pacing` is what ``Publishing`` calls: ``room`` caps what a store's scheduler is asked for
(``due(now, room)``) at its tenant's tokens, ``took`` takes them for what was handed out, and
``wake`` moves a store's next due time, for the loop's wait, to when its tenant's next token comes.
A paced record is only ever held back: it is handed out later than its due time, never earlier,
and the lateness is its tenant's alone (the other tenants' stores are not capped). The backlog,
the retry heap and the dead letters are not paced: each of those records took its token when it
was first handed out, or is not a delivery (a dead letter).

``lag_s`` is how far behind each paced tenant is: the lateness of the oldest record its last
handed-out batch held (0 once it keeps up), the ``delay_sidecar_pacing_lag_seconds`` gauge.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

BURST_S = 0.1  # a bucket holds this many seconds of its rate (at least two records)
_UNIT = 1_000_000  # credit per record: rate_milli (thousandths per s) x 1 ms


class TokenBucket:
    """Tokens at ``rate`` records/s, at most ``burst``; the clock reading (ms) is passed in."""

    __slots__ = ("at_ms", "cap", "credit", "rate_milli")

    def __init__(self, rate: float, now_ms: int, burst: int | None = None) -> None:
        self.rate_milli = max(1, round(rate * 1000))
        burst = burst if burst is not None else max(2, int(rate * BURST_S))
        self.cap = burst * _UNIT
        self.credit = self.cap  # a new bucket is full
        self.at_ms = now_ms

    def _fill(self, now_ms: int) -> None:
        if now_ms > self.at_ms:
            self.credit = min(self.cap, self.credit + (now_ms - self.at_ms) * self.rate_milli)
            self.at_ms = now_ms

    def available(self, now_ms: int) -> int:
        """Whole records that may be handed out at ``now_ms``."""
        self._fill(now_ms)
        return self.credit // _UNIT

    def take(self, n: int, now_ms: int) -> None:
        """``n`` records handed out (at most ``available``)."""
        self._fill(now_ms)
        self.credit = max(0, self.credit - n * _UNIT)

    def next_ms(self, now_ms: int) -> int:
        """When the next record may be handed out (``now_ms`` if one may now)."""
        self._fill(now_ms)
        short = _UNIT - self.credit
        return now_ms if short <= 0 else now_ms + -(-short // self.rate_milli)


class Pacing:
    """The buckets of the paced tenants, by ingress topic (``tenants``: ``tenants.Tenant``)."""

    def __init__(self, tenants: Iterable[Any], now_ms: int) -> None:
        self.buckets = {t.ingress_topic: TokenBucket(t.max_delivery_rate, now_ms)
                        for t in tenants if t.max_delivery_rate is not None}
        self.names = {t.ingress_topic: t.name for t in tenants if t.max_delivery_rate is not None}
        self.lag_s = dict.fromkeys(self.names.values(), 0.0)  # by tenant name: the gauge

    def room(self, topic: str, room: int, now_ms: int) -> int:
        """``room`` capped at the tokens of the tenant of ``topic`` (a store's ingress topic)."""
        b = self.buckets.get(topic) if self.buckets else None
        return room if b is None else min(room, b.available(now_ms))

    def took(self, topic: str, batch: list[tuple[int, Any]], now_ms: int) -> None:
        """``batch`` (``(ref, Record)``) was handed out of a store of ``topic``'s tenant."""
        b = self.buckets.get(topic) if self.buckets else None
        if b is not None and batch:
            b.take(len(batch), now_ms)
            self.lag_s[self.names[topic]] = max(0, now_ms - min(rec.due_ms for _ref, rec in batch)) / 1000

    def wake(self, topic: str, due_ms: int | None, now_ms: int) -> int | None:
        """A store's next due time as the loop's wait sees it: not before its tenant's next token."""
        b = self.buckets.get(topic) if self.buckets else None
        if b is None or due_ms is None:
            return due_ms
        return max(due_ms, b.next_ms(now_ms))
