"""Scenario ``pg-poll``: the PostgreSQL polling delay queue (:mod:`bench.pg_worker`) beside the
sidecar on the same machine and load, with equal durability.

A PostgreSQL server of its own (:mod:`bench.pg_server`: fsync and synchronous commit on, as the
sidecar's default ``fsync: batch``); ``WORKERS`` worker processes claim due rows with ``FOR UPDATE
SKIP LOCKED`` in batches of ``pg_worker.BATCH``, publish them (acks=all, idempotent) and delete
them in the same transaction after the Kafka flush (at-least-once).

* Throughput (a backlog due now): N rows of 100 B (1M at full size:
  :func:`bench.peers.fast_peer_records`), due 0-10 s before the workers start (the
  ``throughput`` scenario's workload), inserted in 10 000-row ``COPY`` transactions, then
  ``VACUUM (ANALYZE)``d (what autovacuum does after a bulk insert: the visibility map and the
  statistics) and ``CHECKPOINT``ed, so that every round's drain starts from the same state: no
  autovacuum of the insert and no timed checkpoint (``checkpoint_timeout`` 30 min) falls into one
  round's drain and not another's, and each round's deletes write the full-page images of the
  first change after a checkpoint (the autovacuums and checkpoints during each drain are in its
  details). The workers drain the table; the rate is taken over the delivered records'
  timestamps, as for every system in the bench. In the same
  rotated rounds the sidecar (each scheduler) drains the same N from a pre-loaded topic; the ratio
  is taken within a round and the figure is its median. The spread of the queue's own rate over
  the rounds, ``(max - min) / median``, is reported beside it (issue goal: <= 15 %).
* Lateness at 50 % of the queue's own measured maximum: a producer thread inserts rows at that
  rate (a transaction per 10 ms tick, delays uniform 1-10 s) while the workers poll; lateness is
  the delivered record's timestamp minus its due time (``delay.deliver-at``).
* Disk per pending record: M rows due in 30 min; table + index size after a ``CHECKPOINT``
  (``pg_total_relation_size``) and the WAL written by their insert, each over M. Memory is not
  per record here: PostgreSQL's shared buffers are sized up front (256 MB) and the table is
  cached in them and in the page cache.
* Restart with those M rows pending: the server SIGKILLed and started again, the time to the first
  on-time delivery (:mod:`bench.peer_restart`, the sidecar's ``restart`` method).
* Mass expiry: N rows due in one millisecond inserted (the table emptied first), the workers
  started before that millisecond, the drain rate from it to the last delivery, beside the
  sidecar's drain of N (:mod:`bench.peer_expiry`).
* Cancel by id: half of N pending rows deleted by id, 1,000 a transaction, beside the sidecar
  cancelling as many with ``delay.cancel`` records (:mod:`bench.peer_cancel`).
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from bench import peer_cancel, peer_expiry, peer_restart, peers, throughput
from bench.lateness import WHEEL_DELAYS
from bench.machine import machine_figures
from bench.peers import peer_round, spread_figure
from bench.pg_server import SETTINGS, PgServer
from bench.pg_worker import BATCH, DELETE, POLL_INTERVAL_MS, SCHEMA, TABLE, Row, insert_rows
from bench.report import Figure, fig
from bench.restart import STEP_MS
from bench.throughput import MAX_DELAY_MS
from bench.workload import (
    Bench,
    BenchError,
    Preloaded,
    ScriptProc,
    lateness_percentiles,
    log,
    uid,
    value_of,
    wall_ms,
)
from sidecar.store.codec import encode_headers

PG = "pg"
WORKERS = 2  # one per core of the bench machine; a third only adds lock and CPU contention
INSERT_BATCH = 10_000
PENDING_DELAY_MS = 1_800_000
NO_HEADERS = encode_headers([])


def sizes(bench: Bench) -> tuple[int, list[int], float]:
    """(throughput records, pending counts for the disk figure, lateness seconds)."""
    return (peers.fast_peer_records(bench), peers.pending_counts(bench, 100_000),
            60.0 if bench.full else 10.0)


def rows(target: str, n: int, due: Any, start: int = 0) -> list[Row]:
    value = value_of(100)
    return [(due(i), target, b"k%d" % i, value, NO_HEADERS) for i in range(start, start + n)]


def load(srv: PgServer, target: str, n: int, due: Any, settle: bool = False) -> float:
    """Empty the table, insert ``n`` rows in ``INSERT_BATCH`` transactions, ANALYZE; rows/s.
    ``settle`` (a throughput round): ``VACUUM (ANALYZE)`` and a ``CHECKPOINT`` instead, so that
    every round's drain starts from the same state (module docstring)."""
    with srv.connect() as conn:
        conn.execute(f"TRUNCATE {TABLE}")
        t0 = time.monotonic()
        for start in range(0, n, INSERT_BATCH):
            insert_rows(conn, rows(target, min(INSERT_BATCH, n - start), due, start))
        secs = time.monotonic() - t0
        if settle:
            conn.execute(f"VACUUM (ANALYZE) {TABLE}")
            conn.execute("CHECKPOINT")
        else:
            conn.execute(f"ANALYZE {TABLE}")
    return n / secs if secs > 0 else 0.0


def run_workers(bench: Bench, srv: PgServer, count: int, until_ms: int, tag: str) -> list[dict[str, Any]]:
    return peers.run_workers(bench, "bench.pg_worker", ["--conninfo", srv.conninfo], WORKERS, count, until_ms, tag)


def delivered(bench: Bench, target: str, start: dict[int, int], res: list[dict[str, Any]], n: int) -> dict[str, Any]:
    _got, out = peers.delivered(bench, target, start, n, res)
    return {**out, "rolled_back_batches": sum(r["rolled_back"] for r in res)}


def measure_pg(bench: Bench, srv: PgServer, n: int, target: str) -> dict[str, Any]:
    base = wall_ms() - MAX_DELAY_MS - 1_000
    rnd = random.Random(8)
    dues = [base + rnd.randrange(MAX_DELAY_MS) for _ in range(n)]
    insert_rate = load(srv, target, n, dues.__getitem__, settle=True)
    start = bench.wm.high(target)
    cpu0, before = srv.cpu_seconds(), srv.maintenance(TABLE)
    res = run_workers(bench, srv, n, 0, "tp")
    server_cpu = srv.cpu_seconds() - cpu0
    during = {f"{k}_during_drain": v - before[k] for k, v in srv.maintenance(TABLE).items()}
    out = delivered(bench, target, start, res, n)
    del out["late_ms"]
    return {**out, "server_cpu_us_per_record": server_cpu * 1e6 / n, "insert_rows_per_s": insert_rate, **during}


def measure_round(bench: Bench, srv: PgServer, pre: Preloaded, target: str, n: int, r: int) -> dict[str, Any]:
    return peer_round(bench, r, "pg-poll", PG, "PostgreSQL queue", lambda: measure_pg(bench, srv, n, target),
                      pre, target, "pg")


class PacedInserter(threading.Thread):
    """Inserts ``rate`` rows/s for ``seconds``, one transaction per 10 ms tick, each due
    ``delay(i)`` ms after its insert."""

    def __init__(self, srv: PgServer, target: str, rate: float, seconds: float) -> None:
        super().__init__(daemon=True)
        self.srv, self.target, self.rate, self.seconds = srv, target, rate, seconds
        self.sent = 0
        self.last_due = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        rnd = random.Random(8)
        lo, hi = WHEEL_DELAYS
        value = value_of(100)
        try:
            with self.srv.connect(autocommit=True) as conn:
                t0 = time.monotonic()
                while (elapsed := time.monotonic() - t0) < self.seconds:
                    want = int(elapsed * self.rate) - self.sent
                    if want > 0:
                        now = wall_ms()
                        batch: list[Row] = []
                        for i in range(self.sent, self.sent + want):
                            due = now + rnd.randint(lo, hi)
                            self.last_due = max(self.last_due, due)
                            batch.append((due, self.target, b"p%d" % i, value, NO_HEADERS))
                        self.sent += insert_rows(conn, batch)
                    time.sleep(0.01)
        except BaseException as e:  # reported by the scenario, not lost in a thread
            self.error = e


def measure_lateness(bench: Bench, srv: PgServer, rate: float, seconds: float) -> dict[str, Any]:
    target = f"bench.pg.lat.{uid()}"
    bench.topics(target)
    with srv.connect() as conn:
        conn.execute(f"TRUNCATE {TABLE}")
    ins = PacedInserter(srv, target, rate, seconds)
    # the workers run until every row the inserter can write is due (its last due time is at most
    # the end of its run plus the longest delay), then exit on the first empty poll
    until = wall_ms() + int(seconds * 1000) + WHEEL_DELAYS[1] + 500
    holder: list[list[dict[str, Any]]] = []
    workers = threading.Thread(target=lambda: holder.append(run_workers(bench, srv, int(rate * seconds), until, "lat")))
    workers.start()
    ins.start()
    ins.join(seconds + 120)
    workers.join(seconds + WHEEL_DELAYS[1] / 1000 + 300)
    if ins.error is not None:
        raise BenchError(f"pg-poll: the paced inserter failed: {ins.error}")
    if not holder:
        raise BenchError("pg-poll: the lateness workers did not finish")
    out = delivered(bench, target, {}, holder[0], ins.sent)
    late = out.pop("late_ms")
    return {"offered_rate": rate, "sent": ins.sent, **out, **lateness_percentiles(late)}


class PgCrash:
    """The PostgreSQL queue as :func:`bench.peer_restart.measure` crashes it: the probes are rows
    inserted before the crash (its producers cannot write while it is down)."""

    def __init__(self, bench: Bench, srv: PgServer) -> None:
        self.bench, self.srv = bench, srv

    def write_probes(self, target: str, s_ms: int, n: int) -> None:
        with self.srv.connect() as conn:
            insert_rows(conn, rows(target, n, lambda k: s_ms + k * STEP_MS))

    def kill(self) -> None:
        self.srv.kill()

    def start_workers(self, target: str, until_ms: int, n: int) -> list[ScriptProc]:
        return peers.start_workers(self.bench, "bench.pg_worker",
                                   ["--conninfo", self.srv.conninfo, "--connect-timeout", "60"], WORKERS, n, until_ms,
                                   "restart")

    def start(self) -> None:
        self.srv.start()

    def pending(self) -> int:
        with self.srv.connect() as conn:
            row = conn.execute(f"SELECT count(*) FROM {TABLE} WHERE due_ms > %s", (wall_ms(),)).fetchone()
        return int(str(row[0])) if row else -1


class PgExpiry:
    """The PostgreSQL queue as :func:`bench.peer_expiry.measure` drives it: the N rows inserted (the
    disk figure's ``load``), then the workers started, polling across the due time."""

    def __init__(self, bench: Bench, srv: PgServer) -> None:
        self.bench, self.srv = bench, srv

    def load(self, target: str, n: int, due_ms: int) -> None:
        load(self.srv, target, n, lambda _i: due_ms)

    def drain(self, target: str, due_ms: int, n: int) -> None:
        run_workers(self.bench, self.srv, n, due_ms + 1_000, "me")

    def stop(self) -> None:
        return None  # run_workers returns once its workers exited


class PgCancel:
    """The PostgreSQL queue as :func:`bench.peer_cancel.measure` drives it: loaded and drained as
    for the mass expiry, the rows' ids read back after the load (a ``bigserial``, in insert
    order), cancels as ``DELETE ... WHERE id = ANY``, ``peer_cancel.CANCEL_BATCH`` ids a
    transaction."""

    def __init__(self, bench: Bench, srv: PgServer) -> None:
        self.srv = srv
        self.queue = PgExpiry(bench, srv)
        self.rids: list[int] = []

    def load(self, target: str, n: int, due_ms: int) -> list[bytes]:
        self.queue.load(target, n, due_ms)
        with self.srv.connect() as conn:
            self.rids = [int(str(r[0])) for r in conn.execute(f"SELECT id FROM {TABLE} ORDER BY id").fetchall()]
        return [b"%d" % r for r in self.rids]

    def cancel(self, which: list[int]) -> None:
        with self.srv.connect() as conn:  # autocommit: each DELETE its own (fsync'd) transaction
            for start in range(0, len(which), peer_cancel.CANCEL_BATCH):
                conn.execute(DELETE, ([self.rids[i] for i in which[start:start + peer_cancel.CANCEL_BATCH]],))

    def drain(self, target: str, due_ms: int, n: int) -> None:
        self.queue.drain(target, due_ms, n)

    def stop(self) -> None:
        self.queue.stop()


def expiry_lead_ms(bench: Bench) -> int:
    """The rows' due time after the load starts: the load runs at ~250k rows/s here (1M in 4 s)."""
    return 30_000 if bench.full else 5_000


def measure_disk(bench: Bench, srv: PgServer, m: int) -> dict[str, Any]:
    with srv.connect() as conn:
        conn.execute(f"TRUNCATE {TABLE}")
        conn.execute("CHECKPOINT")
        lsn0 = conn.execute("SELECT pg_current_wal_lsn()").fetchone()
    now = wall_ms()
    insert_rate = load(srv, f"bench.pg.pending.{uid()}", m, lambda _i: now + PENDING_DELAY_MS)
    with srv.connect() as conn:
        conn.execute("CHECKPOINT")
        row = conn.execute(f"SELECT (SELECT count(*) FROM {TABLE}), pg_table_size('{TABLE}'), "
                           f"pg_indexes_size('{TABLE}'), pg_total_relation_size('{TABLE}'), "
                           "pg_wal_lsn_diff(pg_current_wal_lsn(), %s)",
                           (lsn0[0] if lsn0 else None,)).fetchone()
    assert row is not None
    count, table, indexes, total, wal = (int(str(v)) for v in row)
    if count != m:
        raise BenchError(f"PostgreSQL holds {count} pending rows, expected {m}")
    return {"pending": m, "table_bytes": table, "index_bytes": indexes, "total_bytes": total, "wal_bytes": wal,
            "insert_rows_per_s": insert_rate}


def disk_figures(disk: dict[str, Any]) -> dict[str, Figure]:
    m = disk["pending"]
    return {"bytes_per_pending": fig(disk["total_bytes"] / m, "B",
                                     note=f"table + indexes after CHECKPOINT, {m:,} rows"),
            "wal_bytes_per_pending": fig(disk["wal_bytes"] / m, "B", note="WAL written by the insert"),
            "insert_rows_per_s": fig(disk["insert_rows_per_s"], "records/s",
                                     note=f"{INSERT_BATCH}-row COPY transactions, one producer")}


def run(bench: Bench) -> dict[str, Any]:
    n, counts, seconds = sizes(bench)
    m = counts[0]
    rounds_n = throughput.rounds_for(bench)
    srv = PgServer(bench.workdir)
    results: dict[str, Any] = {}
    details: dict[str, Any] = {"postgres_version": srv.version()}
    try:
        with srv.connect() as conn:
            conn.execute(SCHEMA)
        # -- throughput ---------------------------------------------------------------------------
        pre, target = peers.backlog(bench, n)
        rounds = peers.rounds_after_warm_up(bench, lambda r: measure_round(bench, srv, pre, target, n, r), details)
        details["rounds"] = rounds
        rates = [one[PG]["records_per_s"] for one in rounds]
        pg_rate = throughput.median(rates)
        note = f"median of {rounds_n} rounds" if rounds_n > 1 else None
        results["pg"] = {
            "records_per_s": fig(pg_rate, "records/s", note=note),
            "rate_spread": spread_figure(rates),
            **machine_figures(rounds, PG),
            "early": fig(sum(one[PG]["early"] for one in rounds), "records", "== 0"),
            "cpu_us_per_record": fig(throughput.median([one[PG]["cpu_us_per_record"] for one in rounds]), "us",
                                     note="the workers' CPU, median over rounds"),
            "server_cpu_us_per_record": fig(throughput.median([one[PG]["server_cpu_us_per_record"] for one in rounds]),
                                            "us", note="the PostgreSQL server's CPU, median over rounds"),
            "lost": fig(sum(one[PG]["lost"] for one in rounds), "records", "== 0"),
            "duplicates": fig(sum(one[PG]["duplicates"] for one in rounds), "records",
                              note="at-least-once: a batch rolled back after a failed flush is published again"),
        }
        results.update(peers.sidecar_figures(bench, rounds, "pg-poll", PG, "PostgreSQL queue", note))
        # -- lateness at 50 % of the queue's own maximum ----------------------------------------
        rate = max(100.0, (pg_rate or 0) / 2)
        lat = measure_lateness(bench, srv, rate, seconds)
        details["lateness"] = lat
        log(f"pg-poll lateness at {rate:,.0f}/s: p50 {lat['p50']} ms, p99 {lat['p99']} ms, early {lat['early']}")
        results["pg_lateness"] = peers.lateness_figures(lat)
        # -- disk per pending record ------------------------------------------------------------
        details["disk"] = disk = measure_disk(bench, srv, m)
        results["pg_disk"] = disk_figures(disk)
        # -- restart after a crash, the disk figure's rows pending -------------------------------
        peer_restart.report("pg-poll", PG, peer_restart.measure(bench, "pg", PgCrash(bench, srv), m), results, details)
        # -- mass expiry and cancel by id, each beside the sidecar's -----------------------------------
        peer_expiry.beside(bench, "pg-poll", "pg", PG, PgExpiry(bench, srv), expiry_lead_ms(bench), results, details)
        peer_cancel.beside(bench, "pg-poll", "pg", PG, PgCancel(bench, srv), expiry_lead_ms(bench) * 2, results,
                           details)
        # -- disk per pending record at the further counts (10M) -----------------------------------
        for more in counts[1:]:
            label = peers.count_label(more)
            details[f"disk_{label}"] = disk = measure_disk(bench, srv, more)
            results[f"pg_disk_{label}"] = disk_figures(disk)
            log(f"pg-poll: {more:,} pending, {disk['total_bytes'] / more:.0f} B per row")
    finally:
        srv.stop()
        bench.cleanup_topics()
    return {
        "method": "PostgreSQL table (id, due_ms, target, key, value, headers; index on due_ms) polled by "
                  f"{WORKERS} workers with SELECT ... WHERE due_ms <= now ORDER BY due_ms LIMIT {BATCH} FOR UPDATE "
                  "SKIP LOCKED, publish (acks=all, idempotent), flush, DELETE, COMMIT (at-least-once); the same "
                  "all-due backlog as throughput, back to back with the sidecar in rotated rounds; lateness at 50 % "
                  "of its own maximum; table + index bytes per pending row; restart after a SIGKILL with those rows "
                  "pending, to the first on-time delivery; N rows due in one ms drained by the running workers, "
                  "beside the sidecar's mass-expiry drain; half of N pending rows deleted by id, beside the sidecar's "
                  "cancels",
        "settings": {"records": n, "rounds": rounds_n, "workers": WORKERS, "batch": BATCH,
                     "poll_interval_ms": POLL_INTERVAL_MS, "insert_batch": INSERT_BATCH, "pending_records": counts,
                     "mass_expiry_records": peer_expiry.records_for(bench), "lateness_seconds": seconds,
                     "lateness_delays_ms": WHEEL_DELAYS, "postgres": SETTINGS,
                     "indexes": ["primary key (id)", "btree (due_ms)"], "schedulers": bench.schedulers},
        "results": results,
        "details": details,
    }

