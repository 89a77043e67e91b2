"""Scenario ``redis-zset``: the Youzan-style Redis sorted-set delay queue on the same workload.

A ``redis-server`` from the distribution's packages (``scripts/setup.d/40-redis.sh``) runs on a
free loopback port in a temp directory with the durability the sidecar has (issue #55: equal
durability): the append-only file fsync'd before Redis answers a write (``--appendonly yes
--appendfsync always``; Redis groups the writes of one event-loop turn into one fsync, as the
sidecar's default ``fsync: batch`` makes a batch durable before its ingress commit), no RDB
snapshots (``--save ''``), and is shut down at the end. The queue itself is
:mod:`bench.redis_worker` (intake -> ZADD + job hash, Lua mover -> ready list, worker -> Kafka) in
one Python process with the same Kafka client settings as the sidecar.

* Throughput: exactly the ``throughput`` method (100 B records, random 0-10 s delays, N
  pre-loaded and all due before the process starts, rate over the delivered timestamps), the Redis
  worker and the sidecar (each scheduler) on the same pre-loaded topic, back to back, in the same
  rotated rounds as ``throughput`` (Redis flushed before each of its runs); the ratio is taken
  within a round and the figure is its median. Goal: the sidecar at >= 2x the Redis queue.
* Lateness at 50 % of the queue's own maximum: a paced stream of ingress records (delays uniform
  1-10 s) for the lateness time through the worker (:func:`bench.peers.paced_lateness`, as for
  the other peers); lateness is the delivered record's timestamp minus its due time.
* Memory per pending record: M records with a 30 min delay go through the worker's intake only;
  Redis ``INFO memory`` ``used_memory`` (and ``used_memory_rss``) before and after, divided by M,
  next to the sidecar's RSS per pending record from ``pending-memory`` when it ran in this
  invocation; disk per pending record: the append-only file's growth, each size taken after a
  ``BGREWRITEAOF`` (the data set, not the commands that built it).
* Restart with those M records pending: redis-server SIGKILLed and started again on its
  append-only file, the time to the first on-time delivery (:mod:`bench.peer_restart`, the
  sidecar's ``restart`` method).
* Mass expiry: N ingress records due in one millisecond, read into the sorted set by the worker
  that then delivers them, the drain rate from that millisecond to the last delivery, beside the
  sidecar's drain of N (:mod:`bench.peer_expiry`).
* Cancel by id: half of N pending jobs removed (``ZREM`` + ``HDEL``, 1,000 a pipelined round
  trip), beside the sidecar cancelling as many with ``delay.cancel`` records
  (:mod:`bench.peer_cancel`).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from bench import peer_cancel, peer_expiry, peer_restart, peers, throughput
from bench.lateness import WHEEL_DELAYS
from bench.machine import machine_figures
from bench.peers import peer_round, spread_figure
from bench.ports import listener_port
from bench.redis_worker import JOBS, ZSET
from bench.report import fig
from bench.restart import STEP_MS
from bench.workload import (
    Bench,
    BenchError,
    Preloaded,
    ScriptProc,
    log,
    preload,
    read_range,
    spawn,
    stop_proc,
    uid,
    wait_until,
    wall_ms,
)
from sidecar import contract as c

PENDING_DELAY_MS = 1_800_000
REDIS = "redis"
PERSISTENCE = ["--save", "", "--appendonly", "yes", "--appendfsync", "always"]


def sizes(bench: Bench) -> tuple[int, list[int]]:
    """(throughput records, pending counts for the memory figure)."""
    return (400_000 if bench.full else 20_000), peers.pending_counts(bench, 100_000)


def lateness_seconds(bench: Bench) -> float:
    return 60.0 if bench.full else 10.0


def measure_lateness(bench: Bench, srv: RedisServer, rate: float) -> dict[str, Any]:
    """The worker on a paced stream at ``rate`` (:func:`bench.peers.paced_lateness`), from an empty
    Redis; it runs until every accepted record is delivered, then is stopped."""
    srv.client.flushall()
    srv.aof_bytes()

    procs: list[ScriptProc] = []

    def start(ingress: str, _target: str) -> ScriptProc:
        procs.append(ScriptProc("bench.redis_worker", bench.workdir,
                                ["--bootstrap", bench.bootstrap, "--source", ingress, "--group",
                                 f"bench-redis-{uid()}", "--redis-port", str(srv.port), "--count", str(10**12),
                                 "--timeout", "3600"], tag="lat"))
        procs[0].start()
        procs[0].wait_event("ready", 60)
        return procs[0]

    try:
        lat = peers.paced_lateness(bench, "rz", rate, lateness_seconds(bench), start)
    finally:
        for p in procs:  # stopped on a failure too: it would otherwise poll Redis for an hour
            p.stop()
    return lat


class RedisServer:
    def __init__(self, workdir: Path) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise BenchError("redis-server is not installed (scripts/setup.d/40-redis.sh installs it)")
        self.dir = Path(tempfile.mkdtemp(prefix="redis-", dir=workdir))
        self.port = listener_port()  # below the ephemeral range: free again at the restart (bench/ports.py)
        self.client = redis.Redis(host="127.0.0.1", port=self.port)
        self.start()

    def start(self) -> None:
        """Start the server on its directory (after a :meth:`kill`, it loads the append-only file
        first) and wait until it answers PING (not while it loads: ``LOADING``)."""
        exe = shutil.which("redis-server")
        assert exe is not None
        self.proc = spawn([exe, "--port", str(self.port), "--bind", "127.0.0.1", *PERSISTENCE,
                           "--dir", str(self.dir), "--daemonize", "no", "--protected-mode", "yes",
                           "--logfile", str(self.dir / "redis.log")], self.dir / "redis.out")

        def up() -> bool:
            if self.proc.poll() is not None:
                raise BenchError(f"redis-server exited: {(self.dir / 'redis.log').read_text(errors='replace')[-500:]}")
            try:
                return bool(self.client.ping())
            except redis.ConnectionError:  # refused, or BusyLoadingError while it loads
                return False

        wait_until("redis-server to answer PING", up, 120, 0.05)

    def kill(self) -> None:
        """A crash: SIGKILL, what the append-only file holds is what comes back."""
        self.proc.kill()
        self.proc.wait(30)
        self.client.connection_pool.disconnect()

    def used_memory(self) -> tuple[int, int]:
        info = self.client.info("memory")
        return int(info["used_memory"]), int(info["used_memory_rss"])

    def aof_bytes(self) -> int:
        """The append-only file's size once rewritten (``BGREWRITEAOF``): what the data set takes on
        disk, without the history of commands since the last rewrite."""
        def idle() -> bool:
            info = self.client.info("persistence")
            return not int(info["aof_rewrite_in_progress"]) and not int(info["aof_rewrite_scheduled"])

        wait_until("no AOF rewrite running", idle, 120, 0.1)
        self.client.bgrewriteaof()
        time.sleep(0.2)
        wait_until("the AOF rewrite to finish", idle, 600, 0.1)
        return sum(f.stat().st_size for f in self.dir.rglob("*.aof*") if f.is_file())

    def version(self) -> str:
        return str(self.client.info("server").get("redis_version"))

    def stop(self) -> None:
        with contextlib.suppress(redis.RedisError):
            self.client.shutdown(nosave=True)
        stop_proc(self.proc, timeout_s=30)
        shutil.rmtree(self.dir, ignore_errors=True)


def run_worker(bench: Bench, srv: RedisServer, source: str, count: int, intake_only: bool,
               tag: str) -> dict[str, Any]:
    args = ["--bootstrap", bench.bootstrap, "--source", source, "--group", f"bench-redis-{uid()}", "--redis-port",
            str(srv.port), "--count", str(count), "--timeout", str(throughput.timeout_for(count))]
    if intake_only:
        args.append("--intake-only")
    proc = ScriptProc("bench.redis_worker", bench.workdir, args, tag=tag)
    proc.start()
    return proc.result(throughput.timeout_for(count) + 60)


class RedisCrash:
    """The Redis queue as :func:`bench.peer_restart.measure` crashes it: the probes are ingress
    records (its producers write to Kafka, which stays up), read by the worker after the restart."""

    def __init__(self, bench: Bench, srv: RedisServer) -> None:
        self.bench, self.srv = bench, srv
        self.source = ""

    def write_probes(self, target: str, s_ms: int, n: int) -> None:
        self.source = f"bench.rz.restart.in.{uid()}"
        self.bench.topics(self.source)
        preload(self.bench.bootstrap, self.source, n, 100, target, lambda _k: 0,
                schedule=lambda k: [(c.DELIVER_AT, b"%d" % (s_ms + k * STEP_MS))])

    def kill(self) -> None:
        self.srv.kill()

    def start_workers(self, target: str, until_ms: int, n: int) -> list[ScriptProc]:
        return [start_worker(self.bench, self.srv, self.source, n, until_ms, "restart", ["--connect-timeout", "120"])]

    def start(self) -> None:
        self.srv.start()

    def pending(self) -> int:
        return int(self.srv.client.zcount(ZSET, f"({wall_ms()}", "+inf"))


def start_worker(bench: Bench, srv: RedisServer, source: str, count: int, until_ms: int, tag: str,
                 extra: list[str] | None = None) -> ScriptProc:
    """A worker process (started, not awaited) whose timeout covers the wait until ``until_ms`` (the
    worker has no ``--until-ms``: it stops at ``count`` records)."""
    proc = ScriptProc("bench.redis_worker", bench.workdir,
                      ["--bootstrap", bench.bootstrap, "--source", source, "--group", f"bench-redis-{uid()}",
                       "--redis-port", str(srv.port), "--count", str(count),
                       "--timeout", str(peers.worker_timeout(count, until_ms)), *(extra or [])], tag=tag)
    proc.start()
    return proc


class RedisExpiry:
    """The Redis queue as :func:`bench.peer_expiry.measure` drives it: N ingress records due at T,
    read by one worker process (the one that then delivers them) until the sorted set holds N."""

    def __init__(self, bench: Bench, srv: RedisServer) -> None:
        self.bench, self.srv = bench, srv
        self.proc: ScriptProc | None = None

    def load(self, target: str, n: int, due_ms: int) -> None:
        self.srv.client.flushall()
        source = f"bench.rz.expiry.in.{uid()}"
        self.bench.topics(source)
        preload(self.bench.bootstrap, source, n, 100, target, lambda _k: 0,
                schedule=lambda _k: [(c.DELIVER_AT, b"%d" % due_ms)])
        self.proc = proc = start_worker(self.bench, self.srv, source, n, due_ms, "me")
        wait_until(f"Redis to hold the {n:,} records due at once", lambda: self.srv.client.zcard(ZSET) >= n,
                   max(1.0, (due_ms - wall_ms()) / 1000), 0.1, proc.check_alive)

    def drain(self, target: str, due_ms: int, n: int) -> None:
        assert self.proc is not None
        self.proc.result(throughput.timeout_for(n) + max(0, due_ms - wall_ms()) / 1000 + 60)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


class RedisCancel:
    """The Redis queue as :func:`bench.peer_cancel.measure` drives it: N ingress records through an
    intake-only worker (a job's id is its ingress ``topic:partition:offset``), cancels as ``ZREM`` +
    ``HDEL``, ``peer_cancel.CANCEL_BATCH`` ids a pipelined round trip, and a delivering worker (on
    an empty ingress topic: it only delivers) across the due time."""

    def __init__(self, bench: Bench, srv: RedisServer) -> None:
        self.bench, self.srv = bench, srv
        self.proc: ScriptProc | None = None
        self.ids: list[bytes] = []

    def load(self, target: str, n: int, due_ms: int) -> list[bytes]:
        self.srv.client.flushall()
        source = f"bench.rz.cancel.in.{uid()}"
        self.bench.topics(source)
        preload(self.bench.bootstrap, source, n, 100, target, lambda _k: 0,
                schedule=lambda _k: [(c.DELIVER_AT, b"%d" % due_ms)])
        run_worker(self.bench, self.srv, source, n, True, "cx")
        held = int(self.srv.client.zcard(ZSET))
        if held != n:
            raise BenchError(f"Redis holds {held} members after the intake of {n}")
        self.ids = [b"%s:0:%d" % (source.encode(), i) for i in range(n)]  # one partition, offsets 0..n-1
        return self.ids

    def cancel(self, which: list[int]) -> None:
        for start in range(0, len(which), peer_cancel.CANCEL_BATCH):
            batch = [self.ids[i] for i in which[start:start + peer_cancel.CANCEL_BATCH]]
            pipe = self.srv.client.pipeline(transaction=False)
            pipe.zrem(ZSET, *batch)
            pipe.hdel(JOBS, *batch)
            removed, _ = pipe.execute()
            if removed != len(batch):
                raise BenchError(f"Redis removed {removed} of {len(batch)} cancelled members")

    def drain(self, target: str, due_ms: int, n: int) -> None:
        empty = f"bench.rz.cancel.none.{uid()}"
        self.bench.topics(empty)
        self.proc = start_worker(self.bench, self.srv, empty, n, due_ms, "cx")
        self.proc.result(throughput.timeout_for(n) + max(0, due_ms - wall_ms()) / 1000 + 60)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


def expiry_lead_ms(bench: Bench) -> int:
    """T after the load starts: the preload (~200k records/s) and the worker's intake (~80k/s with
    an fsync'd append-only file) of N."""
    return 60_000 if bench.full else 10_000


def measure_redis(bench: Bench, srv: RedisServer, pre: Preloaded, target: str) -> dict[str, Any]:
    srv.client.flushall()
    srv.aof_bytes()  # each round from a freshly rewritten AOF: its automatic rewrites fall alike in every round
    start = bench.wm.high(target)
    spawned = wall_ms()
    res = run_worker(bench, srv, pre.topic, pre.n, False, "tp")
    got = read_range(bench.bootstrap, target, start, bench.wm.high(target), headers=True)
    return {"records_per_s": got.window_rate(), "window_ms": got.window(), "delivered": len(got.ts),
            "spawn_to_done_s": (wall_ms() - spawned) / 1000, "cpu_us_per_record": res["cpu_s"] * 1e6 / pre.n,
            "early": sum(1 for ts, da in zip(got.ts, got.deliver_at, strict=True) if ts < da)}


def measure_round(bench: Bench, srv: RedisServer, pre: Preloaded, target: str, r: int) -> dict[str, Any]:
    """The Redis queue and every scheduler back to back on one pre-loaded topic (a ``throughput``
    round); ratios against this round's Redis rate."""
    return peer_round(bench, r, "redis-zset", REDIS, "Redis queue", lambda: measure_redis(bench, srv, pre, target),
                      pre, target, "rz")


def measure_memory(bench: Bench, srv: RedisServer, m: int, results: dict[str, Any], details: dict[str, Any],
                   suffix: str = "") -> None:
    """M pending records through the worker's intake only: ``used_memory`` (and RSS) and the
    rewritten AOF per record, beside the sidecar's ``pending-memory`` figures when they ran;
    ``results["redis_memory" + suffix]``, ``details`` likewise."""
    srv.client.flushall()
    time.sleep(0.5)
    used0, rss0 = srv.used_memory()
    aof0 = srv.aof_bytes()
    ingress, tgt = f"bench.rz.pm.{uid()}", f"bench.rz.pmout.{uid()}"
    bench.topics(ingress, tgt)
    preload(bench.bootstrap, ingress, m, 100, tgt, lambda _i: PENDING_DELAY_MS)
    run_worker(bench, srv, ingress, m, True, "pm")
    pending = int(srv.client.zcard(ZSET))
    if pending != m:
        raise BenchError(f"Redis holds {pending} pending members, expected {m}")
    used1, rss1 = srv.used_memory()
    aof1 = srv.aof_bytes()
    ours = bench.results.get("pending-memory-per-record", {})
    mem = results["redis_memory" + suffix] = {
        "used_memory_bytes_per_pending": fig((used1 - used0) / m, "B", note=f"{m:,} pending"),
        "used_memory_rss_bytes_per_pending": fig((rss1 - rss0) / m, "B"),
        "aof_bytes_per_pending": fig((aof1 - aof0) / m, "B", note="the append-only file after BGREWRITEAOF"),
    }
    for sched, per in ours.items():
        note = f"from pending-memory at {per['n']:,} pending"
        for k in ("rss_loaded", "rss_reopened", "anon_reopened"):
            mem[f"sidecar_{sched}_{k}_bytes_per_pending"] = fig(per[k], "B", note=note)
    details["redis_memory" + suffix] = {"pending": m, "used_memory_before": used0, "used_memory_after": used1,
                               "used_memory_rss_before": rss0, "used_memory_rss_after": rss1,
                               "aof_bytes_before": aof0, "aof_bytes_after": aof1}


def run(bench: Bench) -> dict[str, Any]:
    n, counts = sizes(bench)
    m = counts[0]
    srv = RedisServer(bench.workdir)
    results: dict[str, Any] = {}
    details: dict[str, Any] = {"redis_version": srv.version()}
    try:
        # -- throughput -------------------------------------------------------------------------
        pre, target = peers.backlog(bench, n)
        rounds = peers.rounds_after_warm_up(bench, lambda r: measure_round(bench, srv, pre, target, r), details)
        details["rounds"] = rounds
        redis_rate = throughput.median([one[REDIS]["records_per_s"] for one in rounds])
        early = sum(one[REDIS]["early"] for one in rounds)
        results["redis"] = {"records_per_s": fig(redis_rate, "records/s"), "early": fig(early, "records", "== 0"),
                            "rate_spread": spread_figure([one[REDIS]["records_per_s"] for one in rounds]),
                            **machine_figures(rounds, REDIS)}
        note = f"median of {len(rounds)} rounds" if len(rounds) > 1 else None
        for sched in bench.schedulers:
            ratio = throughput.median([one[sched]["ratio_to_redis"] for one in rounds])
            log(f"redis-zset: sidecar {sched} median {ratio or 0:.2f}x Redis")
            results[sched] = {"records_per_s": fig(throughput.median([one[sched]["records_per_s"] for one in rounds]),
                                                   "records/s"),
                              "ratio_to_redis": fig(ratio, "x", ">= 2", note=note)}
        # -- lateness at 50 % of the queue's own maximum ------------------------------------------
        rate = max(100.0, (redis_rate or 0) / 2)
        lat = measure_lateness(bench, srv, rate)
        details["lateness"] = lat
        log(f"redis-zset lateness at {rate:,.0f}/s: p50 {lat['p50']} ms, p99 {lat['p99']} ms, early {lat['early']}")
        results["redis_lateness"] = peers.lateness_figures(lat)
        # -- memory per pending record ------------------------------------------------------------
        measure_memory(bench, srv, m, results, details)
        # -- restart after a crash, those records pending -----------------------------------------
        peer_restart.report("redis-zset", REDIS, peer_restart.measure(bench, "rz", RedisCrash(bench, srv), m), results,
                            details)
        # -- mass expiry and cancel by id, each beside the sidecar's -----------------------------------
        peer_expiry.beside(bench, "redis-zset", "rz", REDIS, RedisExpiry(bench, srv), expiry_lead_ms(bench), results,
                           details)
        peer_cancel.beside(bench, "redis-zset", "rz", REDIS, RedisCancel(bench, srv), expiry_lead_ms(bench), results,
                           details)
        # -- memory per pending record at the further counts (10M) ---------------------------------
        for more in counts[1:]:
            measure_memory(bench, srv, more, results, details, f"_{peers.count_label(more)}")
    finally:
        srv.stop()
        bench.cleanup_topics()
    return {
        "method": "same fixed-N all-due workload as throughput (100 B, 0-10 s delays) through a Youzan-style Redis "
                  "ZSET queue (HSET job + ZADD, Lua mover to a ready list, LPOP worker -> Kafka) and through the "
                  "sidecar, back to back in rotated rounds, median of the per-round ratios; Redis INFO "
                  "used_memory per pending record; lateness at 50 % of its own maximum; restart after a SIGKILL "
                  "with those records pending, to the first on-time delivery; N records due in one ms drained, "
                  "beside the sidecar's mass-expiry drain; half of N pending jobs removed by id (ZREM + HDEL), beside "
                  "the sidecar's cancels",
        "settings": {"records": n, "rounds": throughput.rounds_for(bench), "pending_records": counts,
                     "mass_expiry_records": peer_expiry.records_for(bench),
                     "lateness_seconds": lateness_seconds(bench), "lateness_delays_ms": WHEEL_DELAYS,
                     "redis_persistence": " ".join(PERSISTENCE),
                     "redis_transport": "TCP 127.0.0.1", "schedulers": bench.schedulers},
        "results": results,
        "details": details,
    }
