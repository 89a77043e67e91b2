"""The bridge of the RabbitMQ TTL + dead-letter-exchange delay queue (:mod:`bench.rabbit_queues`):
consumes the due queue and publishes each message to Kafka, acknowledging it to RabbitMQ only after
Kafka acknowledged the record (at-least-once, like the sidecar's default).

Run as ``python -m bench.rabbit_bridge --port P --bootstrap B [--prefetch N] [--until-ms T]
[--wait-queue Q ...] [--connect-timeout S]``; a
bridge is one process, one AMQP connection and channel, one Kafka producer, one loop:

1. ``basic.qos(prefetch_count=N)`` and ``basic.consume`` on ``kds.due`` with manual
   acknowledgements (https://www.rabbitmq.com/docs/confirms#acknowledgement-modes). At most N
   messages are delivered and not yet acknowledged; N (:data:`PREFETCH`) is above the 100-300 that
   RabbitMQ's consumer-prefetch guide calls typical
   (https://www.rabbitmq.com/docs/confirms#channel-qos-prefetch-throughput) because each message is
   held until Kafka's acknowledgement, so the window must cover the rate times the Kafka round trip
   (the producer's 2 ms linger plus an acks=all write), not only the consumer's own work;
2. each delivery is produced to its ``kds-target`` topic with the sidecar's producer settings
   (acks=all, idempotent: :data:`bench.workload.DELIVERY_PRODUCER`), key ``kds-key``, headers
   ``delay.id`` (the message id), ``delay.deliver-at`` and the record's own;
3. the delivery report settles the message: acknowledged deliveries are acked to RabbitMQ with
   ``multiple=true`` up to the highest tag below which every delivery is settled (reports arrive
   out of order across partitions); a failed report ``basic.nack``s its message with
   ``requeue=true``, so it is delivered again. A crash before the ack redelivers the message:
   duplicates are possible, losses are not.

The bridge exits once the wall clock is past ``until-ms`` (0: at once), nothing is in flight and
the due queue and every ``--wait-queue`` (the TTL queues, whose messages are still to expire) have
been empty for :data:`IDLE_MS` (a passive declare counts a queue's ready messages).
JSON event lines on stdout: ``ready``, ``done`` (published, redelivered, CPU seconds).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from typing import Any

import pika
from confluent_kafka import Producer

from bench.passthrough import emit
from bench.rabbit_queues import DELIVER_AT, DUE_QUEUE, HEADERS, KEY, TARGET, queue_depth
from bench.workload import DELIVERY_PRODUCER, KHeaders
from sidecar import contract as c

PREFETCH = 1_000
IDLE_MS = 300


class Settler:
    """Acknowledges deliveries to RabbitMQ in tag order once Kafka settled each of them."""

    def __init__(self, ch: Any) -> None:
        self.ch = ch
        self.next = 1  # the lowest delivery tag not yet settled
        self.ok: set[int] = set()
        self.nacked: set[int] = set()
        self.in_flight = 0
        self.redelivered = 0

    def done(self, tag: int, failed: bool) -> None:
        self.in_flight -= 1
        if failed:
            self.ch.basic_nack(tag, multiple=False, requeue=True)
            self.nacked.add(tag)
            self.redelivered += 1
        else:
            self.ok.add(tag)

    def flush(self) -> None:
        """One multiple-ack for the settled prefix (nacked tags in it are already settled)."""
        last_ok = 0
        while True:
            if self.next in self.ok:
                self.ok.remove(self.next)
                last_ok = self.next
            elif self.next in self.nacked:
                self.nacked.remove(self.next)
            else:
                break
            self.next += 1
        if last_ok:
            self.ch.basic_ack(last_ok, multiple=True)


def headers_of(props: pika.BasicProperties) -> tuple[str, bytes | None, KHeaders]:
    h = props.headers or {}
    own = h.get(HEADERS) or {}
    kh: KHeaders = [(k, v if isinstance(v, bytes) else str(v).encode()) for k, v in own.items()]
    kh += [(c.ID, str(props.message_id).encode()), (c.DELIVER_AT, str(h[DELIVER_AT]).encode())]
    return str(h[TARGET]), h.get(KEY), kh


def connect(port: int, retry_s: float) -> pika.BlockingConnection:
    """A connection, retried every 10 ms for ``retry_s`` while the node refuses: what a bridge
    deployed beside RabbitMQ does while the node restarts."""
    give_up = time.monotonic() + retry_s
    while True:
        try:
            return pika.BlockingConnection(pika.ConnectionParameters(host="127.0.0.1", port=port, heartbeat=0))
        except pika.exceptions.AMQPConnectionError:
            if time.monotonic() >= give_up:
                raise
            time.sleep(0.01)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.rabbit_bridge")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--prefetch", type=int, default=PREFETCH)
    ap.add_argument("--until-ms", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--wait-queue", action="append", default=[])
    ap.add_argument("--connect-timeout", type=float, default=0,
                    help="keep trying to connect this long (a node starting or recovering its queues)")
    ns = ap.parse_args(argv)
    watched = [DUE_QUEUE, *ns.wait_queue]

    prod = Producer({"bootstrap.servers": ns.bootstrap, **DELIVERY_PRODUCER})
    conn = connect(ns.port, ns.connect_timeout)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=ns.prefetch)
    settler = Settler(ch)
    published = 0

    def on_message(_ch: Any, method: Any, props: pika.BasicProperties, body: bytes) -> None:
        nonlocal published
        tag = int(method.delivery_tag)
        target, key, kh = headers_of(props)
        settler.in_flight += 1

        def report(err: Any, _msg: Any) -> None:
            settler.done(tag, err is not None)

        while True:
            try:
                # positional, as the sidecar calls it
                prod.produce(target, body, key, -1, report, None, 0, kh)
                break
            except BufferError:
                prod.poll(0.01)
        published += 1

    ch.basic_consume(DUE_QUEUE, on_message, auto_ack=False)
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    deadline = time.monotonic() + ns.timeout
    idle_since: float | None = None
    emit("ready")
    while time.monotonic() < deadline:
        before = published
        conn.process_data_events(time_limit=0 if settler.in_flight else 0.02)
        prod.poll(0 if published > before else 0.005)
        settler.flush()
        if published > before or settler.in_flight:
            idle_since = None
            continue
        now = time.monotonic()
        if idle_since is None:
            idle_since = now
        elif (now - idle_since) * 1000 >= IDLE_MS and time.time_ns() // 1_000_000 >= ns.until_ms \
                and all(queue_depth(ch, q) == 0 for q in watched):
            break
    prod.flush(60)
    settler.flush()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    emit("done", published=published, redelivered=settler.redelivered,
         cpu_s=ru.ru_utime + ru.ru_stime - ru0.ru_utime - ru0.ru_stime)
    conn.close()
    return 0 if time.monotonic() < deadline else 1


if __name__ == "__main__":
    sys.exit(main())
