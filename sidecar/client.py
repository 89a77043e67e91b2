"""Producer-side helpers for the wire contract (docs/design.md 1).

Nothing here is required — any Kafka client that sets the ``delay.*`` headers works — but these
spell the contract correctly::

    from confluent_kafka import Producer
    from sidecar import client

    p = Producer({"bootstrap.servers": "localhost:9092"})
    client.send_delayed(p, "orders.timeout", b'{"order": 42}', key=b"42", delay="30m", id="order-42")
    client.reschedule(p, "order-42", "orders.timeout", b'{"order": 42}', key=b"42", delay="1h")  # replaces it
    client.cancel(p, "order-42", key=b"42")     # same key: same ingress partition as the message
    p.flush()

A consumer whose processing failed hands the record back with ``retry_later``; the sidecar
redelivers it after the retry ladder's next step and dead-letters it after ``max-retries``.

``delay`` is either a duration string as a person writes it (``"30m"``, ``"250ms"``: a unit is
required, see ``sidecar.durations``; ``"5"`` is refused) or an ``int`` of milliseconds, for code
that computed the delay itself. ``at`` is epoch milliseconds, an ISO-8601 string with a zone or an
aware ``datetime``. Bad values raise ``ValueError`` with the value and the accepted forms.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from sidecar import contract as c
from sidecar.durations import parse_duration_ms

DEFAULT_INGRESS = "delay.ingress"
Headers = list[tuple[str, bytes]]
_DELIVERY_ADDED = {c.DELIVER_AT, c.ENQUEUED_AT, c.SOURCE, c.RETRY_COUNT, c.ID}


AT_FORMS = (
    "a time is epoch milliseconds (e.g. 1767225600000) or ISO-8601 with a zone "
    "(e.g. 2026-01-01T12:00:00Z, 2026-01-01T13:00:00+01:00)"
)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z: the contract's last due time (headers.MAX_EPOCH_MS)


def delay_ms(value: int | str) -> int:
    """A delay in milliseconds: an ``int`` is milliseconds, a string needs its unit (``"5s"``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"{value!r} ms is negative; a delay is 0 ms or more")
        return value
    if isinstance(value, str):
        return parse_duration_ms(value)
    raise ValueError(f"{value!r} is not a delay; give a duration string such as '5s' or an int of milliseconds")


def deliver_at_ms(at: int | float | str | datetime) -> int:
    """An absolute due time in epoch milliseconds (rounded up, so never early)."""
    if isinstance(at, datetime):
        if at.tzinfo is None:
            raise ValueError(f"{at.isoformat()!r} has no time zone; {AT_FORMS}")
        d = at - _EPOCH
        us = (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds
        return _epoch_ms_checked(-(-us // 1000), repr(at.isoformat()))  # round up: never early
    finite = not isinstance(at, float) or math.isfinite(at)
    if isinstance(at, bool) or not isinstance(at, (int, float, str)) or not finite:
        raise ValueError(f"{at!r} is not a time; {AT_FORMS}")
    if isinstance(at, (int, float)):
        return _epoch_ms_checked(math.ceil(at), repr(at))
    text = at.strip()
    if re.fullmatch(r"[0-9]+", text):
        return _epoch_ms_checked(int(text), repr(at))
    if text.startswith("-"):
        raise ValueError(f"{at!r} is before 1970; {AT_FORMS}")
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"{at!r} is not a time; {AT_FORMS}") from None
    if dt.tzinfo is None:
        raise ValueError(f"{at!r} has no time zone; {AT_FORMS}")
    return deliver_at_ms(dt)


def _epoch_ms_checked(ms: int, shown: str) -> int:
    if ms < 0:
        raise ValueError(f"{shown} is before 1970; {AT_FORMS}")
    if ms > LATEST_MS:
        raise ValueError(f"{shown} is after the year 9999; {AT_FORMS}")
    return ms


def delay_headers(
    target_topic: str,
    *,
    delay: int | str | None = None,
    at: int | float | str | datetime | None = None,
    level: int | None = None,
    id: str | bytes | None = None,
    target_partition: int | None = None,
) -> Headers:
    """The control headers for one delayed record. At most one of ``delay`` (``"5s"``, or an int
    of ms), ``at`` (epoch ms, ISO-8601 with a zone or an aware datetime) and ``level`` (1-based)."""
    if sum(x is not None for x in (delay, at, level)) > 1:
        raise ValueError("give at most one of delay, at, level")
    h: Headers = [(c.TARGET_TOPIC, target_topic.encode())]
    if delay is not None:
        h.append((c.DELAY_MS, str(delay_ms(delay)).encode()))
    elif at is not None:
        h.append((c.DELIVER_AT, str(deliver_at_ms(at)).encode()))
    elif level is not None:
        h.append((c.LEVEL, str(check_level(level)).encode()))
    if id is not None:
        h.append((c.ID, check_id(id)))
    if target_partition is not None:
        if isinstance(target_partition, bool) or not isinstance(target_partition, int) or target_partition < 0:
            raise ValueError(f"{target_partition!r} is not a partition; a partition is 0 or more")
        h.append((c.TARGET_PARTITION, str(target_partition).encode()))
    return h


def check_level(level: int) -> int:
    """A delay level: 1-based index into the sidecar's level table."""
    if isinstance(level, bool) or not isinstance(level, int) or level < 1:
        raise ValueError(f"{level!r} is not a level; a level is 1, 2, ... (1-based index into the level table)")
    return level


def check_id(id: str | bytes) -> bytes:
    rid = id.encode() if isinstance(id, str) else id
    if not rid or len(rid) > c.MAX_ID_BYTES:
        raise ValueError(f"{id!r} is {len(rid)} bytes; an id is 1..{c.MAX_ID_BYTES} bytes")
    return rid


def send_delayed(
    producer: Any,
    target_topic: str,
    value: bytes | str | None,
    *,
    key: bytes | str | None = None,
    delay: int | str | None = None,
    at: int | float | str | datetime | None = None,
    level: int | None = None,
    id: str | bytes | None = None,
    target_partition: int | None = None,
    headers: Sequence[tuple[str, bytes]] = (),
    ingress_topic: str = DEFAULT_INGRESS,
    on_delivery: Callable[..., None] | None = None,
) -> None:
    """Produce one delayed record to the ingress topic (call ``producer.flush()`` or ``poll``)."""
    h = [*headers, *delay_headers(target_topic, delay=delay, at=at, level=level, id=id,
                                  target_partition=target_partition)]
    kwargs: dict[str, Any] = {}
    if on_delivery is not None:
        kwargs["on_delivery"] = on_delivery
    producer.produce(ingress_topic, value=value, key=key, headers=h, **kwargs)


def cancel(
    producer: Any, id: str | bytes, *, key: bytes | str | None, ingress_topic: str = DEFAULT_INGRESS,
    on_delivery: Callable[..., None] | None = None,
) -> None:
    """Cancel the pending record whose ``delay.id`` is ``id``. Use the message's own key, so the
    cancel lands in the same ingress partition (the partition's store is where the message is)."""
    rid = id.encode() if isinstance(id, str) else id
    kwargs: dict[str, Any] = {}
    if on_delivery is not None:
        kwargs["on_delivery"] = on_delivery
    producer.produce(ingress_topic, value=None, key=key, headers=[(c.CANCEL, rid)], **kwargs)


def reschedule(
    producer: Any,
    id: str | bytes,
    target_topic: str,
    value: bytes | str | None,
    *,
    key: bytes | str | None,
    delay: int | str | None = None,
    at: int | float | str | datetime | None = None,
    level: int | None = None,
    target_partition: int | None = None,
    headers: Sequence[tuple[str, bytes]] = (),
    ingress_topic: str = DEFAULT_INGRESS,
    on_delivery: Callable[..., None] | None = None,
) -> None:
    """Replace the pending record whose ``delay.id`` is ``id`` with this one (new due time, key,
    value, headers; ``delay.replace: true``): once the sidecar has stored it, the old version never
    fires; if nothing is pending under ``id``, it is scheduled as new. Use the message's own key,
    so the replace lands in the same ingress partition, after the message (as for ``cancel``)."""
    h = [*headers, *delay_headers(target_topic, delay=delay, at=at, level=level, id=check_id(id),
                                  target_partition=target_partition), (c.REPLACE, b"true")]
    kwargs: dict[str, Any] = {}
    if on_delivery is not None:
        kwargs["on_delivery"] = on_delivery
    producer.produce(ingress_topic, value=value, key=key, headers=h, **kwargs)


def retry_later(producer: Any, msg: Any, *, ingress_topic: str = DEFAULT_INGRESS) -> int:
    """Hand a consumed, delivered record back for a delayed retry (RocketMQ ``%RETRY%``).

    Keeps the key, value, user headers and target (the topic it was consumed from), increments
    ``delay.retry-count``, and gives the retry its own ``delay.id`` (``<id>~r<n>``) so a retry sent
    twice for the same attempt is deduplicated. Returns the new retry count."""
    headers = msg.headers() or []
    count = 0
    rid: bytes | None = None
    user: Headers = []
    for name, value in headers:
        if name == c.RETRY_COUNT and value:
            count = int(value)
        elif name == c.ID and value:
            rid = value
        elif name in _DELIVERY_ADDED or name in c.CONTROL_HEADERS:
            continue
        else:
            user.append((name, value))
    count += 1
    base = rid or f"{msg.topic()}:{msg.partition()}:{msg.offset()}".encode()
    stem, sep, n = base.rpartition(b"~r")
    if sep and n.isdigit():
        base = stem
    new_id = base + b"~r" + str(count).encode()
    out: Headers = [*user, (c.TARGET_TOPIC, msg.topic().encode()), (c.RETRY_COUNT, str(count).encode())]
    if len(new_id) <= c.MAX_ID_BYTES:
        out.append((c.ID, new_id))
    producer.produce(ingress_topic, value=msg.value(), key=msg.key(), headers=out)
    return count
