"""Producer-side helpers for the wire contract (docs/design.md 1).

Nothing here is required — any Kafka client that sets the ``delay.*`` headers works — but these
spell the contract correctly::

    from confluent_kafka import Producer
    from sidecar import client

    p = Producer({"bootstrap.servers": "localhost:9092"})
    client.send_delayed(p, "orders.timeout", b'{"order": 42}', key=b"42", delay="30m", id="order-42")
    client.cancel(p, "order-42", key=b"42")     # same key: same ingress partition as the message
    p.flush()

A consumer whose processing failed hands the record back with ``retry_later``; the sidecar
redelivers it after the retry ladder's next step and dead-letters it after ``max-retries``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sidecar import contract as c
from sidecar.durations import parse_duration_ms

DEFAULT_INGRESS = "delay.ingress"
Headers = list[tuple[str, bytes]]
_DELIVERY_ADDED = {c.DELIVER_AT, c.ENQUEUED_AT, c.SOURCE, c.RETRY_COUNT, c.ID}


def _ms(value: int | str) -> int:
    return parse_duration_ms(value)


def _epoch_ms(at: int | float | str | datetime) -> int:
    if isinstance(at, datetime):
        if at.tzinfo is None:
            raise ValueError("deliver-at datetime must be timezone-aware")
        return int(at.timestamp() * 1000 + 0.999)  # round up: never early
    if isinstance(at, (int, float)):
        return int(at)
    text = at.strip()
    if text.isdigit():
        return int(text)
    dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return _epoch_ms(dt)


def delay_headers(
    target_topic: str,
    *,
    delay: int | str | None = None,
    at: int | float | str | datetime | None = None,
    level: int | None = None,
    id: str | bytes | None = None,
    target_partition: int | None = None,
) -> Headers:
    """The control headers for one delayed record. At most one of ``delay`` (ms or ``"5s"``),
    ``at`` (epoch ms, ISO-8601 or an aware datetime) and ``level`` (1-based)."""
    if sum(x is not None for x in (delay, at, level)) > 1:
        raise ValueError("give at most one of delay, at, level")
    h: Headers = [(c.TARGET_TOPIC, target_topic.encode())]
    if delay is not None:
        h.append((c.DELAY_MS, str(_ms(delay)).encode()))
    elif at is not None:
        h.append((c.DELIVER_AT, str(_epoch_ms(at)).encode()))
    elif level is not None:
        h.append((c.LEVEL, str(int(level)).encode()))
    if id is not None:
        rid = id.encode() if isinstance(id, str) else id
        if not rid or len(rid) > c.MAX_ID_BYTES:
            raise ValueError(f"id must be 1..{c.MAX_ID_BYTES} bytes")
        h.append((c.ID, rid))
    if target_partition is not None:
        h.append((c.TARGET_PARTITION, str(int(target_partition)).encode()))
    return h


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
