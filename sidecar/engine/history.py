"""The history topic (``history-topic``, off by default): one record per state change.

A store reports each state change of a schedule through one call of its ``history`` (the
``History`` protocol of ``store/mirroring.py``); this writer turns it into a record of the
history topic and produces it on the delivery producer:

- **events**: ``accepted`` (stored and scheduled), ``replaced`` (a pending record replaced by a
  newer version), ``cancelled`` (a pending record cancelled, or a record dropped because a cancel
  for its id came first), ``delivered`` (its delivery was acknowledged), ``dead-lettered`` (bad
  input, or a publish that failed for good; the dead letter itself then goes to the DLQ).
- **key**: the ``delay.id``, so one id's history is ordered in one partition of the topic.
- **value** (format version 1): a JSON object ::

      {"v": 1, "event": "accepted", "id": "order-42", "at_ms": 1767225600123,
       "enqueued_ms": 1767225600000, "due_ms": 1767227400000, "target": "orders.timeout",
       "target_partition": -1, "level": 0, "source": "delay.ingress:2:17"}

  ``at_ms`` is when the sidecar saw the change (wall clock); ``enqueued_ms`` the ingress record's
  timestamp; ``due_ms`` the committed due time; ``source`` the ingress record
  (``<topic>:<partition>:<offset>``). ``dead-lettered`` adds ``reason`` (a DLQ reason code) and
  ``error``. A field not known at that point (the target of bad input without one) is ``null``.
  The key and value of the record are never in it unless ``history-payload: true``, which adds
  ``key_b64`` and ``value_b64`` (base64, ``null`` for a null key or value). A new field may be
  added within version 1; a change of meaning increments ``v``.

**Never in the way of delivery.** A history write is produced asynchronously with no delivery
wait; a full producer queue drops it rather than wait, and a refused write is not retried. Either
is counted (``delay_sidecar_history_failed_total``) and logged as ``history.write_failed`` at most
once per 30 s with the count since the last line. Delivery never depends on it: the history is an
audit trail, at most once per change, and a change replayed after a crash (records re-consumed,
or restored on another instance) may appear twice; readers take the first per id and event.
"""

from __future__ import annotations

import base64
from typing import Any

import orjson

from sidecar import logs
from sidecar.engine.clock import Clock

log = logs.get("sidecar")

FORMAT_VERSION = 1
ACCEPTED, REPLACED, CANCELLED, DELIVERED, DEAD_LETTERED = (
    "accepted", "replaced", "cancelled", "delivered", "dead-lettered")
EVENTS = (ACCEPTED, REPLACED, CANCELLED, DELIVERED, DEAD_LETTERED)
WARN_EVERY_S = 30.0


def _b64(raw: bytes | None) -> str | None:
    return None if raw is None else base64.b64encode(raw).decode()


class HistoryWriter:
    """Writes history records on ``kafka.producer`` (the delivery producer; it may be replaced)."""

    __slots__ = ("_failed_logged", "_last_warn", "clock", "failed", "kafka", "payload", "topic", "written")

    def __init__(self, kafka: Any, topic: str, payload: bool, clock: Clock) -> None:
        self.kafka = kafka
        self.clock = clock  # the loop's: at_ms of a change reported without one
        self.topic = topic
        self.payload = payload
        self.written = 0  # acknowledged by the broker
        self.failed = 0  # dropped (queue full) or refused
        self._failed_logged = 0
        self._last_warn = -WARN_EVERY_S

    def event(
        self, event: str, rid: bytes, *, enqueued_ms: int | None, due_ms: int | None, target: bytes | str | None,
        target_partition: int = -1, level: int = 0, source: str | None = None, reason: str | None = None,
        error: str | None = None, key: bytes | None = None, value: bytes | None = None, at_ms: int | None = None,
    ) -> None:
        doc: dict[str, Any] = {
            "v": FORMAT_VERSION, "event": event, "id": rid.decode("utf-8", "replace"),
            "at_ms": self.clock.wall_ms() if at_ms is None else at_ms,
            "enqueued_ms": enqueued_ms, "due_ms": due_ms,
            "target": target.decode("utf-8", "replace") if isinstance(target, bytes) else target,
            "target_partition": target_partition, "level": level, "source": source,
        }
        if reason is not None:
            doc["reason"] = reason
            doc["error"] = error
        if self.payload:
            doc["key_b64"] = _b64(key)
            doc["value_b64"] = _b64(value)
        try:
            # positional, as in publishing.py: topic, value, key, partition, callback
            self.kafka.producer.produce(self.topic, orjson.dumps(doc), bytes(rid), -1, self._on_delivery)
        except BufferError:
            self._failure("the producer queue is full")
        except Exception as e:  # the client's local errors: never the delivery's problem
            self._failure(str(e))

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        if err is None:
            self.written += 1
        else:
            self._failure(str(err))

    def _failure(self, why: str) -> None:
        self.failed += 1
        now = self.clock.monotonic()
        if now - self._last_warn >= WARN_EVERY_S:
            log.warning("history.write_failed", topic=self.topic, error=why,
                        failed_since_last=self.failed - self._failed_logged, failed_total=self.failed,
                        action="the history misses these changes; delivery is not affected")
            self._last_warn = now
            self._failed_logged = self.failed
