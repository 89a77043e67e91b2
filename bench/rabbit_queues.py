"""The RabbitMQ TTL + dead-letter-exchange delay queue (the seeds' RabbitMQ design), as its users
build it: the topology, the message format and the confirming publisher. The bridge that moves due
messages to Kafka is :mod:`bench.rabbit_bridge`.

Topology (:func:`declare`), following RabbitMQ's TTL and DLX documents
(https://www.rabbitmq.com/docs/ttl#per-queue-message-ttl, https://www.rabbitmq.com/docs/dlx):

* one durable queue per delay level, ``kds.delay.<level>``, declared with ``x-message-ttl`` = the
  level's delay and ``x-dead-letter-exchange`` = ``kds.due`` (routing key ``due``). The levels are
  the sidecar's own ``--scheduler levels`` table (``1s 5s ... 2h``) unless told otherwise, and a
  requested delay is rounded **up** to its level with the sidecar's own rule
  (:func:`sidecar.levels.table.level_for_delay`): never early, late by up to the gap to the next
  level. Every message of a queue has the same TTL, so the queue expires its head first and dead-
  letters in publish order: delivery is FIFO per queue, and a record is only as precise as its
  level (a 61 s delay waits 2 min with the default table);
* the dead-letter exchange ``kds.due`` (direct, durable) and the durable due queue ``kds.due``
  bound to it: expired messages land there, and due-now records are published to it directly;
* the queue type (:data:`QUEUE_TYPES`): ``quorum`` (the default) with ``x-dead-letter-strategy:
  at-least-once`` and ``x-overflow: reject-publish``, the only mode in which RabbitMQ re-publishes
  a dead letter with confirms before removing it from its source queue
  (https://www.rabbitmq.com/docs/quorum-queues#dead-lettering: the same at-least-once the sidecar
  gives); or ``classic`` (what most tutorials and the seed declare), where dead-lettering is at-most-
  once: "messages can be lost if the target queue is not available".

Messages (:func:`properties`): the body is the Kafka record's value; ``delivery_mode=2``
(persistent); ``message_id`` = the record's id; headers ``kds-target`` (the Kafka topic),
``kds-key`` (bytes), ``kds-deliver-at`` (the due time in ms, ``publish clock + level``: the queue
starts the TTL when it enqueues the message, after the publisher read its clock, so the due time
is never later than the expiry) and the record's own headers under ``kds-h``.

Publishing (:class:`ConfirmingPublisher`): pika's asynchronous adapter, one channel in confirm
mode, up to :data:`CONFIRM_WINDOW` messages unconfirmed at once and confirms handled as they
arrive (``multiple`` acks included): RabbitMQ's "handling publisher confirms asynchronously"
strategy (https://www.rabbitmq.com/tutorials/tutorial-seven-python, https://www.rabbitmq.com/docs/
confirms#publisher-confirms). A confirm for a persistent message routed to a durable queue means
the queue has it on disk. A nack or a connection loss fails the run (the bench counts losses, it
does not retry them).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pika
from pika.adapters.blocking_connection import BlockingChannel

from sidecar.config import DEFAULT_LEVELS, parse_levels
from sidecar.durations import format_duration_ms
from sidecar.levels.table import level_for_delay

DUE_EXCHANGE = "kds.due"
DUE_QUEUE = "kds.due"
DUE_KEY = "due"
LEVELS_MS: tuple[int, ...] = parse_levels(DEFAULT_LEVELS)
QUEUE_TYPES = ("quorum", "classic")
CONFIRM_WINDOW = 2_000

TARGET, KEY, DELIVER_AT, HEADERS = "kds-target", "kds-key", "kds-deliver-at", "kds-h"


def type_args(queue_type: str) -> dict[str, Any]:
    if queue_type == "quorum":
        return {"x-queue-type": "quorum", "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
    if queue_type == "classic":
        # version 2 storage: opt-in in 3.10, the default of newer RabbitMQ releases
        return {"x-queue-type": "classic", "x-queue-version": 2}
    raise ValueError(f"queue type must be one of {', '.join(QUEUE_TYPES)}: {queue_type!r}")


def level_queue(level_ms: int) -> str:
    return f"kds.delay.{format_duration_ms(level_ms)}"


def declare(ch: BlockingChannel, queue_type: str, levels_ms: tuple[int, ...] = LEVELS_MS) -> None:
    """Declare (idempotently) the due exchange and queue and one TTL queue per level."""
    args = type_args(queue_type)
    ch.exchange_declare(DUE_EXCHANGE, "direct", durable=True)
    ch.queue_declare(DUE_QUEUE, durable=True, arguments=dict(args))
    ch.queue_bind(DUE_QUEUE, DUE_EXCHANGE, DUE_KEY)
    for ms in levels_ms:
        ch.queue_declare(level_queue(ms), durable=True,
                         arguments={**args, "x-message-ttl": ms, "x-dead-letter-exchange": DUE_EXCHANGE,
                                    "x-dead-letter-routing-key": DUE_KEY})


def queue_depth(ch: BlockingChannel, queue: str) -> int:
    """Messages ready in ``queue`` (a passive declare; unacknowledged deliveries not counted)."""
    return int(ch.queue_declare(queue, passive=True).method.message_count)


@dataclass(frozen=True)
class Record:
    """A delayed Kafka record as a producer hands it to the queue."""

    id: str
    target: str
    key: bytes | None
    value: bytes
    delay_ms: int
    headers: tuple[tuple[str, bytes], ...] = ()


def route(levels_ms: tuple[int, ...], delay_ms: int) -> tuple[str, int]:
    """(routing key on the default exchange, the level's delay): the level's queue, or the due
    queue for a record due now. A delay beyond the last level is refused, as the sidecar does."""
    lv = level_for_delay(levels_ms, delay_ms)
    if lv is None:
        raise ValueError(f"delay {delay_ms} ms is beyond the last level ({levels_ms[-1]} ms)")
    if lv == 0:
        return DUE_QUEUE, 0
    return level_queue(levels_ms[lv - 1]), levels_ms[lv - 1]


def properties(rec: Record, deliver_at: int) -> pika.BasicProperties:
    headers: dict[str, Any] = {TARGET: rec.target, DELIVER_AT: deliver_at, HEADERS: dict(rec.headers)}
    if rec.key is not None:
        headers[KEY] = rec.key
    return pika.BasicProperties(delivery_mode=2, message_id=rec.id, headers=headers)


class PublishError(RuntimeError):
    """The broker nacked or returned a message, or the connection failed mid-run."""


class ConfirmingPublisher:
    """Publish records with confirms on pika's asynchronous adapter (see the module docstring).

    ``run(batches)`` publishes every record the iterator yields and returns once all are
    confirmed. The iterator yields lists of records; an empty list means "nothing now": the
    publisher asks again after ``idle_s`` (a paced producer yields what its clock allows).
    ``on_publish(record, deliver_at)`` is called for each record as it goes out."""

    def __init__(self, params: pika.ConnectionParameters, levels_ms: tuple[int, ...] = LEVELS_MS,
                 window: int = CONFIRM_WINDOW, idle_s: float = 0.005,
                 on_publish: Callable[[Record, int], None] | None = None) -> None:
        self.params, self.levels_ms, self.window, self.idle_s = params, levels_ms, window, idle_s
        self.on_publish = on_publish
        self.published = self.confirmed = 0
        self.error: str | None = None
        self._seq = 0
        self._unconfirmed: set[int] = set()
        self._low = 1  # no sequence number below this one is unconfirmed
        self._pending: list[Record] = []
        self._exhausted = False
        self._waiting = False  # a call_later for the next batch is armed

    def run(self, batches: Iterator[list[Record]]) -> int:
        self._batches = batches
        self._conn = pika.SelectConnection(self.params, on_open_callback=self._opened,
                                           on_open_error_callback=self._failed, on_close_callback=self._closed)
        self._conn.ioloop.start()
        if self.error is not None:
            raise PublishError(self.error)
        return self.confirmed

    # -- connection and channel -----------------------------------------------------------------
    def _opened(self, conn: pika.SelectConnection) -> None:
        conn.channel(on_open_callback=self._channel_open)

    def _failed(self, _conn: Any, err: BaseException) -> None:
        self.error = f"cannot connect: {err}"
        self._conn.ioloop.stop()

    def _closed(self, _conn: Any, reason: BaseException) -> None:
        if not self._done():
            self.error = self.error or f"connection closed: {reason}"
        self._conn.ioloop.stop()

    def _channel_open(self, ch: Any) -> None:
        self._ch = ch
        ch.add_on_close_callback(lambda _c, reason: self._fail(f"channel closed: {reason}"))
        ch.add_on_return_callback(lambda *_a: self._fail("a message was returned (no queue for its routing key)"))
        ch.confirm_delivery(self._on_confirm)
        self._pump()

    def _fail(self, why: str) -> None:
        if self.error is None and not self._done():
            self.error = why
            self._conn.close()

    # -- publishing and confirms ----------------------------------------------------------------
    def _done(self) -> bool:
        return self._exhausted and not self._pending and not self._unconfirmed

    def _pump(self) -> None:
        if self.error is not None or self._waiting:
            return
        while len(self._unconfirmed) < self.window:
            if not self._pending:
                if self._exhausted:
                    break
                try:
                    self._pending = list(reversed(next(self._batches)))
                except StopIteration:
                    self._exhausted = True
                    break
                if not self._pending:  # nothing to send now: ask again shortly
                    self._waiting = True
                    self._conn.ioloop.call_later(self.idle_s, self._wake)
                    return
            rec = self._pending.pop()
            key, level_ms = route(self.levels_ms, rec.delay_ms)
            deliver_at = time.time_ns() // 1_000_000 + level_ms
            self._ch.basic_publish("", key, rec.value, properties(rec, deliver_at), mandatory=True)
            self._seq += 1
            self._unconfirmed.add(self._seq)
            self.published += 1
            if self.on_publish is not None:
                self.on_publish(rec, deliver_at)
        if self._done():
            self._conn.close()

    def _wake(self) -> None:
        self._waiting = False
        self._pump()

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        tag = int(method.delivery_tag)
        if isinstance(method, pika.spec.Basic.Nack):
            self._fail(f"the broker nacked message {tag}")
            return
        # each sequence number is looked at once: a multiple ack walks from the lowest unconfirmed
        for t in range(self._low, tag + 1) if method.multiple else (tag,):
            if t in self._unconfirmed:
                self._unconfirmed.remove(t)
                self.confirmed += 1
        while self._low <= self._seq and self._low not in self._unconfirmed:
            self._low += 1
        # below half the window: top it up (not on every confirm: one pump per few hundred acks)
        if len(self._unconfirmed) <= self.window // 2 or self._done():
            self._pump()
