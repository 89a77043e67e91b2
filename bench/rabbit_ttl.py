"""Scenario ``rabbit-ttl``: the RabbitMQ TTL + dead-letter-exchange delay queue
(:mod:`bench.rabbit_queues`, :mod:`bench.rabbit_bridge`) beside the sidecar on the same machine and
load, with equal durability.

A RabbitMQ node of its own (:mod:`bench.rabbit_server`); the sidecar's level table as durable
quorum TTL queues dead-lettering at-least-once into a durable due queue (:data:`QUEUE_TYPE`);
persistent messages published with confirms; ``WORKERS`` bridge processes (prefetch
``rabbit_bridge.PREFETCH``) publishing to Kafka (acks=all, idempotent) and acking each message
after Kafka did.

* Throughput (a backlog due now): N records of 100 B published with a 1 s delay (the first level)
  while no bridge runs, so all N expire into the due queue (the backlog a bridge finds after an
  outage: the dead-letter exchange moves records as they expire, whether or not a bridge
  consumes); then the quorum queues' write-ahead log is rolled over
  (:meth:`bench.rabbit_server.RabbitServer.roll_over_wal`: the roll-over the node does at
  512 MiB otherwise falls into some drains and not others) and, once the node is at rest
  (:func:`bench.peers.wait_quiet`: the segment writes of that roll-over and what the round
  before left it doing, such as its quorum logs' compaction, fall into no round's drain), the
  bridges start and drain it. The rate is taken over the delivered records'
  timestamps, as for every system in the bench; the publish rate with confirms and the time the
  node took to dead-letter the last record after its TTL are reported beside it. In the same
  rotated rounds the sidecar (each scheduler) drains the same N from a pre-loaded topic
  (:func:`bench.peers.peer_round`); the ratio is taken within a round and the figure is its
  median. The spread of the queue's own rate over the rounds, ``(max - min) / median``, is
  reported beside it (issue goal: <= 15 %).
* Lateness at 50 % of the queue's own measured maximum (capped by what the confirming publisher
  sustains): a publisher thread offers that rate with delays uniform 1-10 s (the levels 1 s, 5 s and
  10 s) while the bridges run; lateness is the delivered record's timestamp minus its level's due
  time (``delay.deliver-at``: the queue's own precision), and, separately, minus the requested due
  time (the rounding up to a level included).
* Memory and disk per pending record: M records of 100 B published into the 30 min level of a
  node just restarted (SIGTERM, start: else the Erlang allocators keep what the lateness run's
  backlog took and the RSS growth hides the new one); the node's RSS growth, the memory it
  accounts to that queue's process (``rabbitmqctl list_queues memory``: the message index, not
  the log's in-memory tables) and its data directory's growth (the quorum queues' write-ahead log
  and segments), each over M.
* Restart with those M records pending: the node SIGKILLed and started again on its data, the
  time to the first on-time delivery (:mod:`bench.peer_restart`, the sidecar's ``restart``
  method). The probes are published before the crash, each into one TTL level (2 min full) a level
  before its due time: RabbitMQ's producers cannot write while it is down, and a TTL queue
  delivers a message one level after its publish.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from typing import Any

from bench import peer_restart, peers, throughput
from bench.lateness import WHEEL_DELAYS
from bench.machine import machine_figures
from bench.peers import peer_round, spread_figure
from bench.rabbit_bridge import PREFETCH
from bench.rabbit_queues import (
    CONFIRM_WINDOW,
    DUE_QUEUE,
    LEVELS_MS,
    ConfirmingPublisher,
    Record,
    declare,
    level_queue,
    queue_depth,
    type_args,
)
from bench.rabbit_server import CONFIG, RabbitServer
from bench.report import Figure, fig
from bench.restart import STEP_MS
from bench.workload import (
    Bench,
    BenchError,
    Preloaded,
    ScriptProc,
    disk_usage,
    lateness_percentiles,
    log,
    uid,
    value_of,
    wait_until,
    wall_ms,
)

RABBIT = "rabbit"
QUEUE_TYPE = "quorum"
WORKERS = 2  # one per core of the bench machine, as for pg-poll
BACKLOG_DELAY_MS = LEVELS_MS[0]
PENDING_DELAY_MS = 1_800_000  # a level of the default table: 30 min


def sizes(bench: Bench) -> tuple[int, list[int], float]:
    """(throughput records, pending counts for the memory and disk figures, lateness seconds)."""
    return (throughput.records_for(bench), peers.pending_counts(bench, 50_000), 60.0 if bench.full else 10.0)


def reset(srv: RabbitServer) -> None:
    with srv.connect() as conn:
        ch = conn.channel()
        for q in (DUE_QUEUE, *map(level_queue, LEVELS_MS)):
            ch.queue_purge(q)


def run_bridges(bench: Bench, srv: RabbitServer, count: int, until_ms: int, tag: str) -> list[dict[str, Any]]:
    waits = [a for ms in LEVELS_MS for a in ("--wait-queue", level_queue(ms))]
    return peers.run_workers(bench, "bench.rabbit_bridge", ["--port", str(srv.port), *waits], WORKERS, count,
                             until_ms, tag)


def backlog(target: str, n: int) -> Iterator[list[Record]]:
    value = value_of(100)
    for start in range(0, n, 1_000):
        yield [Record(f"r{i}", target, b"k%d" % i, value, BACKLOG_DELAY_MS)
               for i in range(start, min(n, start + 1_000))]


def measure_rabbit(bench: Bench, srv: RabbitServer, n: int, target: str) -> dict[str, Any]:
    reset(srv)
    t0 = time.monotonic()
    ConfirmingPublisher(srv.params).run(backlog(target, n))
    publish_s = time.monotonic() - t0
    last_due = time.monotonic() + BACKLOG_DELAY_MS / 1000  # the last record's TTL ends at most then
    with srv.connect() as conn:
        ch = conn.channel()
        wait_until("the TTL queue to dead-letter the backlog", lambda: queue_depth(ch, DUE_QUEUE) >= n,
                   throughput.timeout_for(n), 0.05)
    dead_letter_lag_s = max(0.0, time.monotonic() - last_due)
    srv.roll_over_wal()  # every drain from an empty WAL (RabbitServer.roll_over_wal)
    quiet_s = peers.wait_quiet(srv.cpu_seconds)
    start = bench.wm.high(target)
    cpu0 = srv.cpu_seconds()
    res = run_bridges(bench, srv, n, 0, "tp")
    server_cpu = srv.cpu_seconds() - cpu0
    _got, out = peers.delivered(bench, target, start, n, res)
    del out["late_ms"]
    return {**out, "redelivered": sum(r["redelivered"] for r in res),
            "server_cpu_us_per_record": server_cpu * 1e6 / n, "publish_per_s": n / publish_s,
            "dead_letter_lag_s": dead_letter_lag_s, "quiet_wait_s": quiet_s}


def measure_round(bench: Bench, srv: RabbitServer, pre: Preloaded, target: str, n: int, r: int) -> dict[str, Any]:
    return peer_round(bench, r, "rabbit-ttl", RABBIT, "RabbitMQ TTL queues",
                      lambda: measure_rabbit(bench, srv, n, target), pre, target, "rabbit")


class PacedPublisher(threading.Thread):
    """Publishes ``rate`` records/s for ``seconds`` (what the clock allows every 5 ms), each with a
    requested delay uniform in :data:`WHEEL_DELAYS`; remembers each record's requested due time."""

    def __init__(self, srv: RabbitServer, target: str, rate: float, seconds: float) -> None:
        super().__init__(daemon=True)
        self.srv, self.target, self.rate, self.seconds = srv, target, rate, seconds
        self.requested: dict[bytes, int] = {}
        self.error: BaseException | None = None
        self.sent = 0

    def batches(self) -> Iterator[list[Record]]:
        rnd = random.Random(8)
        lo, hi = WHEEL_DELAYS
        value = value_of(100)
        t0 = time.monotonic()
        while (elapsed := time.monotonic() - t0) < self.seconds:
            want = int(elapsed * self.rate) - self.sent
            batch = [Record(f"p{i}", self.target, b"p%d" % i, value, rnd.randint(lo, hi))
                     for i in range(self.sent, self.sent + max(0, want))]
            self.sent += len(batch)
            yield batch

    def on_publish(self, rec: Record, deliver_at: int) -> None:
        # deliver_at is the publish clock plus the level: the requested due is that clock plus the delay
        level = next(ms for ms in LEVELS_MS if ms >= rec.delay_ms)
        self.requested[rec.id.encode()] = deliver_at - level + rec.delay_ms

    def run(self) -> None:
        try:
            ConfirmingPublisher(self.srv.params, on_publish=self.on_publish).run(self.batches())
        except BaseException as e:  # reported by the scenario, not lost in a thread
            self.error = e


def measure_lateness(bench: Bench, srv: RabbitServer, rate: float, seconds: float) -> dict[str, Any]:
    target = f"bench.rabbit.lat.{uid()}"
    bench.topics(target)
    reset(srv)
    pub = PacedPublisher(srv, target, rate, seconds)
    # the bridges run at least until every record the publisher sends on time is due (the end of its
    # run plus the longest level it uses), then exit once every queue stays empty
    longest = next(ms for ms in LEVELS_MS if ms >= WHEEL_DELAYS[1])
    until = wall_ms() + int(seconds * 1000) + longest + 2_000
    holder: list[list[dict[str, Any]]] = []
    bridges = threading.Thread(target=lambda: holder.append(run_bridges(bench, srv, int(rate * seconds), until,
                                                                        "lat")))
    bridges.start()
    pub.start()
    pub.join(seconds + 300)
    bridges.join(seconds + longest / 1000 + 300)
    if pub.error is not None:
        raise BenchError(f"rabbit-ttl: the paced publisher failed: {pub.error}")
    if not holder:
        raise BenchError("rabbit-ttl: the lateness bridges did not finish")
    got, out = peers.delivered(bench, target, {}, pub.sent, holder[0])
    late = out.pop("late_ms")
    vs_requested = [t - pub.requested[i] for i, t in zip(got.ids, got.ts, strict=True) if i in pub.requested]
    return {"offered_rate": rate, "sent": pub.sent, **out, **lateness_percentiles(late),
            "vs_requested": lateness_percentiles(vs_requested)}


def measure_pending(srv: RabbitServer, m: int) -> dict[str, Any]:
    """``m`` records of 100 B published into the 30 min level (none expires while measured): the
    node's RSS and its data directory's growth, each over ``m``. They are left there (the restart
    figure's pending records)."""
    reset(srv)
    time.sleep(1)  # let the purge's memory and segment files go before the baseline
    queue = level_queue(PENDING_DELAY_MS)
    rss0, (disk0, _a), qmem0 = srv.rss_bytes(), disk_usage(srv.data_dir), srv.queue_memory(queue)
    value = value_of(100)
    t0 = time.monotonic()
    ConfirmingPublisher(srv.params).run(
        [Record(f"m{i}", "bench.rabbit.pending", b"k%d" % i, value, PENDING_DELAY_MS)
         for i in range(start, min(m, start + 1_000))] for start in range(0, m, 1_000))
    publish_s = time.monotonic() - t0
    with srv.connect() as conn:
        count = queue_depth(conn.channel(), queue)
    if count != m:
        raise BenchError(f"RabbitMQ holds {count} pending messages, expected {m}")
    rss1, (disk1, _a), qmem1 = srv.rss_bytes(), disk_usage(srv.data_dir), srv.queue_memory(queue)
    return {"pending": m, "rss_bytes": rss1 - rss0, "disk_bytes": disk1 - disk0, "rss_total": rss1,
            "queue_memory_bytes": qmem1 - qmem0, "publish_per_s": m / publish_s}


def pending_figures(pend: dict[str, Any]) -> dict[str, Figure]:
    m = pend["pending"]
    return {"queue_memory_bytes_per_pending": fig(pend["queue_memory_bytes"] / m, "B",
                                                  note="the queue's memory as the node accounts it"),
            "rss_bytes_per_pending": fig(pend["rss_bytes"] / m, "B",
                                         note=f"the node's RSS growth over {m:,} pending, from a fresh VM"),
            "disk_bytes_per_pending": fig(pend["disk_bytes"] / m, "B", note="the node's data directory growth")}


def measure_pending_and_restart(bench: Bench, srv: RabbitServer, counts: list[int], results: dict[str, Any],
                                details: dict[str, Any]) -> None:
    """Memory and disk with ``counts[0]`` pending on a fresh node, the crash and restart with them
    pending, then memory and disk at each further count, each on a fresh node
    (``rabbit_pending[_<count>]``, ``rabbit_restart``)."""
    m = counts[0]
    reset(srv)
    srv.restart()  # a fresh VM: after the lateness run's backlog its RSS would hide a new one's
    details["pending"] = pend = measure_pending(srv, m)
    results["rabbit_pending"] = pending_figures(pend)
    level = restart_level_ms(bench)
    rs = peer_restart.measure(bench, "rabbit", RabbitCrash(bench, srv, level), m, level + 2_000)
    reset(srv)
    peer_restart.report("rabbit-ttl", RABBIT, rs, results, details)
    for more in counts[1:]:
        srv.restart()
        label = peers.count_label(more)
        details[f"pending_{label}"] = more_pend = measure_pending(srv, more)
        results[f"rabbit_pending_{label}"] = pending_figures(more_pend)
        reset(srv)


def restart_level_ms(bench: Bench) -> int:
    """The probes' level: longer than their window plus the kill's lead, so every probe is
    published before the crash (2 min full, 30 s small)."""
    window_ms = int(peer_restart.probe_seconds(bench) * 1000)
    return next(ms for ms in LEVELS_MS if ms > window_ms + peer_restart.KILL_LEAD_MS + 5_000)


class RabbitCrash:
    """The RabbitMQ queue as :func:`bench.peer_restart.measure` crashes it: probe k is published into
    the ``level_ms`` queue at S - level + k * STEP_MS (its TTL ends at its due time), every one
    before the crash; the bridges wait for that queue and the due queue only (the pending records
    sit in the 30 min level)."""

    def __init__(self, bench: Bench, srv: RabbitServer, level_ms: int) -> None:
        self.bench, self.srv, self.level_ms = bench, srv, level_ms

    def paced(self, target: str, s_ms: int, n: int) -> Iterator[list[Record]]:
        value = value_of(100)
        first = s_ms - self.level_ms
        sent = 0
        while sent < n:
            upto = min(n, max(sent, (wall_ms() - first) // STEP_MS + 1))
            yield [Record(f"probe{k}", target, b"probe%d" % k, value, self.level_ms) for k in range(sent, upto)]
            sent = upto

    def write_probes(self, target: str, s_ms: int, n: int) -> None:
        ConfirmingPublisher(self.srv.params).run(self.paced(target, s_ms, n))

    def kill(self) -> None:
        self.srv.kill()

    def start_workers(self, target: str, until_ms: int, n: int) -> list[ScriptProc]:
        return peers.start_workers(self.bench, "bench.rabbit_bridge",
                                   ["--port", str(self.srv.port), "--wait-queue", level_queue(self.level_ms),
                                    "--connect-timeout", "300"], WORKERS, n, until_ms, "restart")

    def start(self) -> None:
        self.srv.start()

    def pending(self) -> int:
        with self.srv.connect() as conn:
            return queue_depth(conn.channel(), level_queue(PENDING_DELAY_MS))


def run(bench: Bench) -> dict[str, Any]:
    n, counts, seconds = sizes(bench)
    rounds_n = throughput.rounds_for(bench)
    srv = RabbitServer(bench.workdir)
    results: dict[str, Any] = {}
    details: dict[str, Any] = {"rabbitmq_version": srv.version()}
    try:
        with srv.connect() as conn:
            declare(conn.channel(), QUEUE_TYPE)
        # -- throughput ---------------------------------------------------------------------------
        pre, target = peers.backlog(bench, n)
        rounds = peers.rounds_after_warm_up(bench, lambda r: measure_round(bench, srv, pre, target, n, r), details)
        details["rounds"] = rounds
        rates = [one[RABBIT]["records_per_s"] for one in rounds]
        rabbit_rate = throughput.median(rates)
        note = f"median of {rounds_n} rounds" if rounds_n > 1 else None

        def med(key: str) -> float | None:
            return throughput.median([one[RABBIT][key] for one in rounds])

        results["rabbit"] = {
            "records_per_s": fig(rabbit_rate, "records/s", note=note),
            "rate_spread": spread_figure(rates),
            **machine_figures(rounds, RABBIT),
            "early": fig(sum(one[RABBIT]["early"] for one in rounds), "records", "== 0"),
            "lost": fig(sum(one[RABBIT]["lost"] for one in rounds), "records", "== 0"),
            "duplicates": fig(sum(one[RABBIT]["duplicates"] for one in rounds), "records",
                              note="at-least-once: a message nacked after a failed Kafka report is delivered again"),
            "cpu_us_per_record": fig(med("cpu_us_per_record"), "us", note="the bridges' CPU, median over rounds"),
            "server_cpu_us_per_record": fig(med("server_cpu_us_per_record"), "us",
                                            note="the RabbitMQ node's CPU while the bridges drain, median over rounds"),
            "publish_per_s": fig(med("publish_per_s"), "records/s",
                                 note=f"one publisher, confirms, {CONFIRM_WINDOW} unconfirmed at most"),
            "dead_letter_lag_s": fig(med("dead_letter_lag_s"), "s",
                                     note="last record's TTL end to the whole backlog in the due queue"),
        }
        results.update(peers.sidecar_figures(bench, rounds, "rabbit-ttl", RABBIT, "RabbitMQ TTL queues", note))
        # -- lateness at 50 % of the queue's own maximum ----------------------------------------
        rate = max(100.0, min(rabbit_rate or 0, med("publish_per_s") or 0) / 2)
        lat = measure_lateness(bench, srv, rate, seconds)
        details["lateness"] = lat
        log(f"rabbit-ttl lateness at {rate:,.0f}/s: p50 {lat['p50']} ms, p99 {lat['p99']} ms, early {lat['early']}")
        req = lat["vs_requested"]
        # -- memory and disk per pending record, the restart with the first count pending ---------
        measure_pending_and_restart(bench, srv, counts, results, details)
        results["rabbit_lateness"] = {
            **peers.lateness_figures(lat, note="after the level's due time"),
            **{f"requested_{k}_ms": fig(req[k], "ms", note="after the requested due time (level rounding included)")
               for k in ("p50", "p99", "max")},
        }
    finally:
        srv.stop()
        bench.cleanup_topics()
    return {
        "method": "RabbitMQ TTL + dead-letter exchange: one durable quorum queue per sidecar level "
                  "(x-message-ttl, x-dead-letter-exchange, at-least-once dead-lettering) into a durable due queue; "
                  "persistent messages published with confirms; "
                  f"{WORKERS} bridges (prefetch {PREFETCH}) publishing to Kafka (acks=all, idempotent) and acking each "
                  "message after Kafka did; the backlog dead-lettered before the bridges start, back to back with the "
                  "sidecar in rotated rounds; lateness at 50 % of its own maximum; RSS and data directory per pending "
                  "record; restart after a SIGKILL with those records pending, to the first on-time delivery",
        "settings": {"records": n, "rounds": rounds_n, "workers": WORKERS, "prefetch": PREFETCH,
                     "confirm_window": CONFIRM_WINDOW, "queue_type": QUEUE_TYPE,
                     "queue_arguments": type_args(QUEUE_TYPE),
                     "levels_ms": LEVELS_MS, "backlog_delay_ms": BACKLOG_DELAY_MS, "lateness_seconds": seconds,
                     "lateness_delays_ms": WHEEL_DELAYS, "pending_records": counts, "rabbitmq": CONFIG,
                     "schedulers": bench.schedulers},
        "results": results,
        "details": details,
    }
