"""The PostgreSQL polling delay queue (the seeds' "DB polling" design, as db-scheduler, pg-boss and
Procrastinate run it), publishing due rows to Kafka.

The table (:data:`SCHEMA`): one row per delayed record, ``(id, due_ms, target, key, value,
headers)``, a B-tree index on ``due_ms``. Producers insert rows in batches, one transaction each
(:func:`insert_rows`, ``COPY`` as the fastest bulk path psycopg offers).

Run as ``python -m bench.pg_worker --conninfo C --bootstrap B [--batch N] [--poll-interval-ms P]
[--until-ms T] [--connect-timeout S]``; a worker is one process, one connection, one loop:

1. ``BEGIN``; ``SELECT ... WHERE due_ms <= now ORDER BY due_ms LIMIT batch FOR UPDATE SKIP
   LOCKED`` (the claim every one of those libraries uses: rows another worker holds are skipped,
   not waited for, so N workers share the backlog without double delivery);
2. ``produce`` each row to its target with the sidecar's producer settings (acks=all,
   idempotent) and headers ``delay.id`` / ``delay.deliver-at``; ``flush`` until every delivery
   report is in;
3. ``DELETE ... WHERE id = ANY(claimed)`` and ``COMMIT`` (fsync'd): only after Kafka acknowledged
   every record. A crash between 2 and 3 rolls the claim back and the rows are published again:
   at-least-once, like the sidecar's default. A failed delivery report rolls the batch back.

When a poll returns less than a full batch the worker sleeps ``poll-interval-ms``. It exits when a
poll finds nothing due and the wall clock is past ``until-ms`` (0: the first empty poll). JSON
event lines on stdout: ``ready``, ``done`` (published, batches, CPU seconds).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from collections.abc import Iterable
from typing import Any

import psycopg
from confluent_kafka import Producer

from bench.passthrough import emit
from bench.workload import DELIVERY_PRODUCER, KHeaders
from sidecar import contract as c
from sidecar.store.codec import decode_headers

TABLE = "delayed"
SCHEMA = f"""
CREATE TABLE {TABLE} (
  id bigserial PRIMARY KEY,
  due_ms bigint NOT NULL,
  target text NOT NULL,
  key bytea,
  value bytea,
  headers bytea NOT NULL
);
CREATE INDEX {TABLE}_due ON {TABLE} (due_ms);
"""
CLAIM = (f"SELECT id, due_ms, target, key, value, headers FROM {TABLE} WHERE due_ms <= %s "
         "ORDER BY due_ms LIMIT %s FOR UPDATE SKIP LOCKED")
DELETE = f"DELETE FROM {TABLE} WHERE id = ANY(%s)"
BATCH = 1_000
POLL_INTERVAL_MS = 50

Row = tuple[int, str, bytes | None, bytes | None, bytes]  # due_ms, target, key, value, encoded headers


def insert_rows(conn: psycopg.Connection[Any], rows: Iterable[Row]) -> int:
    """One transaction: ``rows`` copied into the table, committed (fsync'd) before returning."""
    n = 0
    with conn.transaction(), conn.cursor() as cur, \
            cur.copy(f"COPY {TABLE} (due_ms, target, key, value, headers) FROM STDIN") as cp:
        for row in rows:
            cp.write_row(row)
            n += 1
    return n


def connect(conninfo: str, retry_s: float) -> psycopg.Connection[Any]:
    """A connection, retried every 10 ms for ``retry_s`` while the server refuses: what a worker
    deployed beside a database does while the database restarts."""
    give_up = time.monotonic() + retry_s
    while True:
        try:
            return psycopg.connect(conninfo, autocommit=False)
        except psycopg.OperationalError:
            if time.monotonic() >= give_up:
                raise
            time.sleep(0.01)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.pg_worker")
    ap.add_argument("--conninfo", required=True)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--batch", type=int, default=BATCH)
    ap.add_argument("--poll-interval-ms", type=int, default=POLL_INTERVAL_MS)
    ap.add_argument("--until-ms", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--connect-timeout", type=float, default=0,
                    help="keep trying to connect this long (a server still starting or recovering)")
    ns = ap.parse_args(argv)

    prod = Producer({"bootstrap.servers": ns.bootstrap, **DELIVERY_PRODUCER})
    conn = connect(ns.conninfo, ns.connect_timeout)
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    failed = [0]
    published = batches = rolled_back = 0
    deadline = time.monotonic() + ns.timeout
    emit("ready")

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failed[0] += 1

    while time.monotonic() < deadline:
        now = time.time_ns() // 1_000_000
        with conn.cursor() as cur:
            rows = cur.execute(CLAIM, (now, ns.batch)).fetchall()
            if not rows:
                conn.rollback()
                if now >= ns.until_ms:
                    break
                time.sleep(ns.poll_interval_ms / 1000)
                continue
            failed[0] = 0
            for rid, due, target, key, value, hdrs in rows:
                headers: KHeaders = [*decode_headers(hdrs), (c.ID, str(rid).encode()),
                                     (c.DELIVER_AT, str(due).encode())]
                while True:
                    try:
                        # positional, as the sidecar calls it
                        prod.produce(target, value, key, -1, on_delivery, None, 0, headers)
                        break
                    except BufferError:
                        prod.poll(0.01)
            left = prod.flush(60)
            if left or failed[0]:
                conn.rollback()  # the claim is released: these rows are published again
                rolled_back += 1
                continue
            cur.execute(DELETE, ([r[0] for r in rows],))
        conn.commit()
        published += len(rows)
        batches += 1
        if len(rows) < ns.batch:
            time.sleep(ns.poll_interval_ms / 1000)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    emit("done", published=published, batches=batches, rolled_back=rolled_back,
         cpu_s=ru.ru_utime + ru.ru_stime - ru0.ru_utime - ru0.ru_stime)
    conn.close()
    return 0 if time.monotonic() < deadline else 1


if __name__ == "__main__":
    sys.exit(main())
