"""etf1/kafka-message-scheduler drop-in: the tombstone written back after a delivery.

etf1 keeps its schedules in a compacted topic (the sidecar's ingress topic, in kafka-message-
scheduler mode) and, once the broker confirmed a delivered schedule, writes a tombstone (null
value) under the schedule's key back to that topic, so compaction removes the schedule and the
topic stays bounded (etf1's runner/kafka/handler.go: the delivery report of the target message
calls ``produceTombstoneMessageForOriginalSchedule``). With ``etf1-tombstones: on`` the sidecar
writes the same tombstone for every record it delivered in kafka-message-scheduler mode:

- **Which records**: a MESSAGE whose stored headers end with the three etf1 adds, with
  ``scheduler-key`` its own id and ``scheduler-topic`` this ingress topic
  (``PartitionStore._kms_id`` appends them; ``schedule_headers`` checks the last one's bytes
  before it decodes anything, so other records cost a ``bytes.endswith``).
- **Key**: the schedule's id (the schedule record's key). etf1 takes the *first* non-empty
  ``scheduler-key`` of the delivered record, which for a record re-sent with the headers of an
  earlier delivery is the earlier schedule's key; the sidecar names the schedule it delivered.
- **Partition**: the ingress partition the schedule came from. Compaction works per partition;
  etf1 lets its producer's partitioner choose, which matches only when the client used the same
  partitioner.
- **Headers**: the delivered record's as etf1 writes them (the schedule's own, then
  ``scheduler-timestamp``, ``scheduler-key``, ``scheduler-topic``), without the sidecar's
  ``delay.*`` delivery headers.
- **When**: at-least-once, from the delivery report that confirms the record (as etf1), before
  the store settles it (``Publishing.poll``); exactly-once, when the record is produced, inside
  the same transaction, so both commit or neither (``Publishing._produce`` and after a C run).
- **Never** for a record replaced while it was being delivered (``store.superseded``): a newer
  schedule under the key is pending, and a tombstone after it would compact it away.

The intake skips such a tombstone when it consumes it (``headers.AfterDelivery``: it carries
``scheduler-key``): a newer schedule under the same key that arrived between the delivery and the
tombstone stays scheduled (etf1 deletes it). In the topic itself compaction still removes a
schedule older than a tombstone under its key, once the sidecar has consumed it: keep the
topic's ``min.compaction.lag.ms`` above the longest time the sidecar may be stopped.

A tombstone the producer refuses (its queue full) or the broker rejects is counted in
``failed`` and logged (etf1 logs it too): the schedule stays in the topic until the next record
under its key. Under exactly-once a rejected one dooms the transaction like a failed delivery.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, Protocol

from sidecar import contract as c
from sidecar import logs
from sidecar.store.codec import MESSAGE, Record, decode_headers, encode_headers

log = logs.get("sidecar")


class _Store(Protocol):
    superseded: set[int]
    topic: str  # its ingress topic: the tombstones' (each tenant's own)


def schedule_headers(rec: Record, tail: bytes) -> list[tuple[str, bytes | None]] | None:
    """The headers of ``rec`` if it is a schedule delivered in kafka-message-scheduler mode, else
    None. ``tail``: the encoded ``scheduler-topic`` header naming the ingress topic (``tail_of``)."""
    if rec.rtype != MESSAGE:
        return None
    blob = rec.headers
    if bytes(blob[-len(tail):]) != tail:
        return None
    headers = decode_headers(blob)
    if len(headers) < 3 or headers[-3][0] != c.KMS_TIMESTAMP or headers[-2] != (c.KMS_KEY, bytes(rec.id)):
        return None
    return headers


def tail_of(ingress_topic: str) -> bytes:
    """The bytes a kafka-message-scheduler record's header blob ends with: its last header,
    ``scheduler-topic: <ingress topic>`` (the blob's count prefix dropped)."""
    return encode_headers([(c.KMS_TOPIC, ingress_topic.encode())])[2:]


class Tombstones:
    """Writes the tombstones (see the module docstring). ``on_rejected(error)``: a tombstone the
    broker rejected (the caller dooms an exactly-once transaction with it); ``errors``: what the
    producer's ``produce`` raises for one record (``BufferError``, the client's exception)."""

    def __init__(
        self, ingress_topic: str, on_rejected: Callable[[str], None], errors: tuple[type[BaseException], ...],
    ) -> None:
        self.topic = ingress_topic
        self.errors = errors  # what ``produce`` raises for one record
        self.tails = {ingress_topic: tail_of(ingress_topic)}  # by ingress topic (several: tenants)
        self.on_rejected = on_rejected
        self.written = 0  # produced (their reports may still come)
        self.failed = 0  # refused by the producer or rejected by the broker

    def write(self, producer: Any, batch: Iterable[tuple[int, Record]], store: _Store) -> None:
        """A tombstone for each schedule in ``batch`` ((ref, record) pairs, delivered or, under
        exactly-once, just produced) that was not replaced meanwhile."""
        superseded = store.superseded
        topic = store.topic
        tail = self.tails.get(topic)
        if tail is None:
            tail = self.tails[topic] = tail_of(topic)
        for ref, rec in batch:
            headers = schedule_headers(rec, tail)
            if headers is None or (superseded and ref in superseded):
                continue
            key = bytes(rec.id)
            try:  # (positional, as Publishing._produce: topic, value, key, partition, callback)
                producer.produce(topic, None, key, rec.src_partition, partial(self._report, topic, key), None, 0,
                                 headers)
            except self.errors as e:  # a full queue: not waited for (the caller is inside a poll)
                self._failed(topic, key, str(e))
                continue
            self.written += 1

    def _report(self, topic: str, key: bytes, err: Any, _msg: Any) -> None:
        if err is not None:
            self._failed(topic, key, err.str())
            self.on_rejected(f"etf1 tombstone for {key[:80]!r} failed: {err.str()}")

    def _failed(self, topic: str, key: bytes, error: str) -> None:
        self.failed += 1
        n = self.failed
        if n <= 10 or n & (n - 1) == 0:
            log.warning("etf1.tombstone_failed", topic=topic, id=key[:80].decode("utf-8", "replace"),
                        error=error, count=n)
