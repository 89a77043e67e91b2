"""Scenario ``streams-punctuator``: the Kafka Streams delay queue (:mod:`bench.streams_peer`, the
Java application in bench/streams-peer/) beside the sidecar on the same machine and load, with
equal durability: both stores changelogged (the Streams default, as the sidecar's changelog is on
by default), at_least_once, the producer with acks=all and idempotence.

The application reads the same ingress records the sidecar reads (``delay.*`` headers), keeps
them in a RocksDB store keyed by big-endian due ms + id, and a wall-clock punctuator every
:data:`bench.streams_peer.PUNCTUATE_MS` ms forwards what is due to its target and deletes it.

* Throughput (a backlog due now): the ``throughput`` scenario's workload (N records of 100 B, 1M
  at full size: :func:`bench.peers.fast_peer_records`; delays 0-10 s, pre-loaded and all due
  before the application starts), read by a fresh application (its own id: a fresh consumer
  group from the earliest offset, fresh changelogs) in one JVM kept for every round
  (:func:`start_host`), as a deployment keeps its JVM: it first runs the topology as an
  application of its own over :func:`warm_up_topic`'s records, then drains the backlog unmeasured
  until its CPU per record is steady (:func:`warm_host`: a JVM kept running went on getting faster
  over its first 3-4M records, 5.9 us per record in its second drain, 3.0 us in its fifth, where a
  fresh JVM per round measured 4.0-6.0 us, each at its own point of that curve). The rate is taken
  over the delivered records' timestamps, as for every system in the bench, so an application's
  start and the group's rebalance are outside it. The lateness, mass-expiry and cancel runs start
  warm JVMs of their own (the warm-up topic first); the restart's is cold, as after a
  crash. In the same rotated rounds the sidecar
  (each scheduler) drains the same topic; the ratio is taken within a round and the figure is its
  median; the spread of the peer's own rate over the rounds, ``(max - min) / median``, is
  reported beside it. CPU per record is the JVM's from ``ready`` (RUNNING) on, its start left out.
  The changelog records per delivered record are the two changelog topics' end offsets over N: a
  stored record costs a put and a delete (a Processor API store has no record cache unless asked,
  so none is absorbed), a record due on arrival none.
* Lateness at 50 % of the peer's own measured maximum, the lower of its two drains
  (:func:`lateness_maximum`; the mass expiry runs before it): a paced producer writes ingress
  records (delays uniform 1-10 s) to a fresh application for the lateness time; lateness is the
  delivered record's timestamp minus its ``delay.deliver-at``. A record delayed 1-10 s takes the
  stored path (put, punctuator scan, forward, delete), whose maximum is the mass-expiry drain, not
  the throughput backlog's (all due on arrival: forwarded, never stored); at half the backlog's
  rate (173k/s) the application fell behind for the whole minute (p99 7.2 s), a figure of the
  method, not of the system. The backlog's rate still bounds it (the stored path ends in the same
  forward) and stands in when the mass expiry was not measured.
* Memory and disk per pending record, and the restart after a SIGKILL with those records pending:
  :mod:`bench.streams_restart`.
* Mass expiry: N ingress records due in one millisecond, stored by a fresh application before
  it, the drain rate from that millisecond to the last forward, beside the sidecar's drain of N
  (:mod:`bench.peer_expiry`): unlike the throughput backlog, every record takes the stored path
  (put, punctuator scan, forward, delete).
* Cancel by id: half of N pending records cancelled with ``delay.cancel`` ingress records (the
  application's ``ids`` store finds each), beside the sidecar cancelling as many
  (:mod:`bench.peer_cancel`).
"""

from __future__ import annotations

import contextlib
import signal
from typing import Any

from bench import peer_cancel, peer_expiry, peer_restart, peers, streams_restart, throughput
from bench.lateness import WHEEL_DELAYS
from bench.peers import paced_lateness, peer_figures, peer_round
from bench.report import Figure, fig, spread
from bench.streams_peer import (
    JVM_OPTS,
    PUNCTUATE_MS,
    StreamsPeerHost,
    StreamsPeerProc,
    changelog_topics,
    installed,
    new_app_id,
)
from bench.workload import (
    Bench,
    BenchError,
    Preloaded,
    cpu_seconds,
    log,
    preload,
    read_range,
    uid,
    wait_until,
    wall_ms,
)
from sidecar import contract as c

STREAMS = "streams"
READY_TIMEOUT_S = 120  # a JVM start, RocksDB, the group's first rebalance, on a loaded machine
WARM_UP_TIMEOUT_S = 300  # StreamsPeer's own bound on its warm-up
STEADY_RUNS, STEADY_SPREAD, WARM_RUNS_MAX = 3, 0.10, 12  # warm_host's rule


def sizes(bench: Bench) -> tuple[int, float]:
    """(throughput records, lateness seconds)."""
    return peers.fast_peer_records(bench), 60.0 if bench.full else 10.0


def warm_up_topic(bench: Bench) -> tuple[str, int]:
    """(topic, records): the throughput scenario's record count, all due on arrival, that each
    measured application's JVM runs through first (``StreamsPeerProc``'s ``warm_up``)."""
    n = throughput.records_for(bench)
    ingress, target = f"bench.sp.warm.in.{uid()}", f"bench.sp.warm.out.{uid()}"
    bench.topics(ingress, target)
    preload(bench.bootstrap, ingress, n, 100, target, lambda _k: 0)
    return ingress, n


def start_peer(bench: Bench, ingress: str, tag: str, warm: tuple[str, int] | None = None) -> StreamsPeerProc:
    """A fresh application on ``ingress``, RUNNING; ``warm``: its JVM warmed up first (:func:`warm_up_topic`)."""
    proc = StreamsPeerProc(bench.workdir, bench.bootstrap, ingress, tag=tag, warm_up=warm)
    bench.topics_to_delete(*changelog_topics(proc.app_id))
    if warm is not None:
        bench.topics_to_delete(*changelog_topics(f"{proc.app_id}-warm"))
    proc.start()
    proc.wait_event("ready", READY_TIMEOUT_S)
    return proc


def changelog_records(bench: Bench, app_id: str) -> int:
    return sum(changelog_records_of(bench, topic) for topic in changelog_topics(app_id))


def changelog_records_of(bench: Bench, topic: str) -> int:
    with contextlib.suppress(BenchError):  # a store never written has no topic yet
        return bench.wm.total(topic)
    return 0


def counters(done: dict[str, Any]) -> dict[str, Any]:
    """The application's own counts from its ``done`` line (scheduled, forwarded, punctuations, ...)."""
    return {k: v for k, v in done.items() if k not in ("event", "ts_ms", "_seen_ms")}


def start_host(bench: Bench, warm: tuple[str, int], pre: Preloaded, target: str,
               details: dict[str, Any]) -> StreamsPeerHost:
    """The JVM the throughput rounds' applications run in, one after another (``StreamsPeerHost``),
    warmed on ``warm`` (:func:`warm_up_topic`) when it starts, then brought to its steady state
    (:func:`warm_host`, its runs in ``details["jvm_warm_up"]``)."""
    host = StreamsPeerHost(bench.workdir, bench.bootstrap, tag="tp", warm_up=warm)
    bench.topics_to_delete(*changelog_topics(f"{host.app_id}-warm"))
    host.start(WARM_UP_TIMEOUT_S + READY_TIMEOUT_S)
    try:
        details["jvm_warm_up"] = warm_host(bench, host, pre, target)
    except BaseException:
        host.finish()
        raise
    return host


def hosted_drain(bench: Bench, pre: Preloaded, target: str, host: StreamsPeerHost) -> tuple[str, float, dict[str, Any]]:
    """A fresh application in ``host`` drains the backlog: (its id, the JVM's CPU seconds from
    RUNNING to the last record delivered, its ``done`` line)."""
    want = bench.wm.total(target) + pre.n
    app_id = new_app_id()
    bench.topics_to_delete(*changelog_topics(app_id))
    app = host.run(pre.topic, READY_TIMEOUT_S, app_id)
    try:
        cpu0 = cpu_seconds(app.pid)
        wait_until(f"{pre.n} records delivered by Kafka Streams", lambda: bench.wm.total(target) >= want,
                   throughput.timeout_for(pre.n), 0.1, app.check_alive)
        cpu = cpu_seconds(app.pid) - cpu0
    finally:
        done = app.finish()
    return app_id, cpu, done


def warm_host(bench: Bench, host: StreamsPeerHost, pre: Preloaded, target: str) -> list[float]:
    """Unmeasured drains of the backlog (:func:`hosted_drain`) until the JVM's CPU per record is
    steady: the last :data:`STEADY_RUNS` within :data:`STEADY_SPREAD` of their median, after
    :data:`WARM_RUNS_MAX` at most (one at small size, the smoke test's); the CPU per record of
    each. One JVM kept getting faster over its first 3-4M records (5.9 us at 241k/s in its second
    run, 3.0 us at 405k/s in its fifth), its JIT and heap still settling, where a deployment's JVM
    has long since settled."""
    cpu: list[float] = []
    while len(cpu) < (WARM_RUNS_MAX if bench.full else 1):
        cpu.append(hosted_drain(bench, pre, target, host)[1] * 1e6 / pre.n)
        last = cpu[-STEADY_RUNS:]
        log(f"streams-punctuator JVM warm-up drain {len(cpu)}: {cpu[-1]:.2f} us per record")
        if len(last) == STEADY_RUNS and (spread(last) or 0) <= STEADY_SPREAD:
            break
    return cpu


def measure_streams(bench: Bench, pre: Preloaded, target: str, host: StreamsPeerHost) -> dict[str, Any]:
    start = bench.wm.high(target)
    app_id, cpu, done = hosted_drain(bench, pre, target, host)
    got = read_range(bench.bootstrap, target, start, bench.wm.high(target), headers=True)
    return {"records_per_s": got.window_rate(), "window_ms": got.window(), "delivered": len(got.ts), "expected": pre.n,
            "duplicates": len(got.ids) - len(set(got.ids)), "lost": pre.n - len(set(got.ids)),
            "early": sum(1 for ts, da in zip(got.ts, got.deliver_at, strict=True) if ts < da),
            "cpu_us_per_record": cpu * 1e6 / pre.n,
            "changelog_records_per_record": changelog_records(bench, app_id) / pre.n,
            "counters": counters(done), "warm_up": counters(host.last("warmed") or {})}


def measure_round(bench: Bench, pre: Preloaded, target: str, r: int, host: StreamsPeerHost) -> dict[str, Any]:
    return peer_round(bench, r, "streams-punctuator", STREAMS, "Kafka Streams",
                      lambda: measure_streams(bench, pre, target, host), pre, target, "streams")


def lateness_maximum(backlog_rate: float | None, expiry_rate: float | None) -> tuple[float | None, str]:
    """(maximum, its name): the rate the lateness run offers half of, the lower of the peer's two
    drains. A 1-10 s delay takes the stored path, whose maximum is the mass-expiry drain
    (``expiry_rate``); the throughput backlog's (``backlog_rate``) is the forward path's alone, all
    due on arrival, and bounds it (it is also the maximum when the mass expiry was not measured)."""
    if expiry_rate and (not backlog_rate or expiry_rate < backlog_rate):
        return expiry_rate, "mass-expiry drain"
    return backlog_rate, "backlog drain"


def measure_lateness(bench: Bench, rate: float, seconds: float, warm: tuple[str, int]) -> dict[str, Any]:
    procs: list[StreamsPeerProc] = []

    def start(ingress: str, _target: str) -> StreamsPeerProc:
        procs.append(start_peer(bench, ingress, "lat", warm))
        return procs[0]

    try:
        lat = paced_lateness(bench, "sp", rate, seconds, start)
    finally:
        done = procs[0].finish() if procs else {}
    return {**lat, "counters": counters(done)}


class StreamsExpiry:
    """The Kafka Streams application as :func:`bench.peer_expiry.measure` drives it: N ingress
    records due at T, read by a fresh application until its ``pending`` store's changelog holds N
    puts (each is stored: none is due on arrival); its punctuator then forwards them."""

    def __init__(self, bench: Bench, warm: tuple[str, int]) -> None:
        self.bench, self.warm = bench, warm
        self.proc: StreamsPeerProc | None = None

    def load(self, target: str, n: int, due_ms: int) -> None:
        ingress = f"bench.sp.expiry.in.{uid()}"
        self.bench.topics(ingress)
        preload(self.bench.bootstrap, ingress, n, 100, target, lambda _k: 0,
                schedule=lambda _k: [(c.DELIVER_AT, b"%d" % due_ms)])
        self.proc = proc = start_peer(self.bench, ingress, "me", self.warm)
        puts = changelog_topics(proc.app_id)[0]
        wait_until(f"Kafka Streams to store the {n:,} records due at once",
                   lambda: changelog_records_of(self.bench, puts) >= n,
                   max(1.0, (due_ms - wall_ms()) / 1000), 0.2, proc.check_alive)

    def drain(self, target: str, due_ms: int, n: int) -> None:
        assert self.proc is not None
        wait_until(f"{n:,} records forwarded by Kafka Streams", lambda: self.bench.wm.total(target) >= n,
                   throughput.timeout_for(n), 0.1, self.proc.check_alive)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.finish()


class StreamsCancel:
    """The Kafka Streams application as :func:`bench.peer_cancel.measure` drives it: N ingress
    records with ids of their own (each then in the ``ids`` store too), cancels as ``delay.cancel``
    ingress records, applied when the ``ids`` changelog holds N puts and K deletes."""

    def __init__(self, bench: Bench, warm: tuple[str, int]) -> None:
        self.bench, self.warm = bench, warm
        self.proc: StreamsPeerProc | None = None
        self.ingress = ""
        self.ids: list[bytes] = []
        self.id_log = ""

    def load(self, target: str, n: int, due_ms: int) -> list[bytes]:
        self.ingress = f"bench.sp.cancel.in.{uid()}"
        self.bench.topics(self.ingress)
        self.ids = [b"sx-%d" % i for i in range(n)]
        preload(self.bench.bootstrap, self.ingress, n, 100, target, lambda _k: 0,
                schedule=lambda _k: [(c.DELIVER_AT, b"%d" % due_ms)], extra=lambda i: [(c.ID, self.ids[i])])
        self.proc = proc = start_peer(self.bench, self.ingress, "cx", self.warm)
        self.id_log = changelog_topics(proc.app_id)[1]
        wait_until(f"Kafka Streams to store {n:,} records with their ids",
                   lambda: changelog_records_of(self.bench, self.id_log) >= n,
                   max(1.0, (due_ms - wall_ms()) / 1000), 0.2, proc.check_alive)
        return self.ids

    def cancel(self, which: list[int]) -> None:
        assert self.proc is not None
        want = len(self.ids) + len(which)
        peer_cancel.produce_cancels(self.bench.bootstrap, self.ingress, self.ids, which, b"k")
        wait_until(f"Kafka Streams to apply {len(which):,} cancels",
                   lambda: changelog_records_of(self.bench, self.id_log) >= want, 120, 0.05, self.proc.check_alive)

    def drain(self, target: str, due_ms: int, n: int) -> None:
        assert self.proc is not None
        wait_until(f"{n:,} records forwarded by Kafka Streams", lambda: self.bench.wm.total(target) >= n,
                   throughput.timeout_for(n) + max(0, due_ms - wall_ms()) / 1000, 0.1, self.proc.check_alive)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.finish()


def expiry_lead_ms(bench: Bench) -> int:
    """T after the load starts: the preload, the JVM's start and the group's first rebalance, and
    the application's stored intake of N (a RocksDB put and a changelog record each)."""
    return 120_000 if bench.full else 45_000


def measure_pending(bench: Bench, m: int, results: dict[str, Any], details: dict[str, Any],
                    restart: bool = True) -> None:
    """Pending memory and disk of a fresh application with ``m`` pending, then (``restart``) its
    restart with them pending (:mod:`bench.streams_restart`): ``details["pending"]`` (the restart
    inside it), and ``results["streams_pending"]`` and ``results["streams_restart"]``; without the
    restart, ``details`` and ``results`` ``["streams_pending_<count>"]`` (``peers.count_label``)."""
    ingress = f"bench.sp.pending.in.{uid()}"
    bench.topics(ingress)
    proc = start_peer(bench, ingress, "pending")
    try:
        pend = (streams_restart.measure if restart else streams_restart.fill)(bench, proc, ingress, m)
    finally:
        proc.stop(signal.SIGTERM, 90)
    key = "streams_pending" if restart else f"streams_pending_{peers.count_label(m)}"
    details[key.removeprefix("streams_")] = pend
    results[key] = streams_restart.figures(pend)
    if restart:
        rs = pend["restart"]
        log(f"streams-punctuator restart with {m:,} pending: {rs['restart_s']} s to the first on-time probe")
        results["streams_restart"] = peer_restart.figures(rs)


def lateness_at_half(bench: Bench, rate: float | None, seconds: float, warm: tuple[str, int],
                     details: dict[str, Any]) -> dict[str, Figure]:
    """The lateness run at half the lower of the peer's two drains (:func:`lateness_maximum`:
    ``rate``, the backlog's, and the mass expiry's in ``details``), its figures; its raw result
    goes to ``details["lateness"]``."""
    expiry_rate = details.get("mass_expiry", {}).get(STREAMS, {}).get("drain_rate")
    maximum, basis = lateness_maximum(rate, expiry_rate)
    offered = max(100.0, (maximum or 0) / 2)
    expiry_s = f"{expiry_rate:,.0f}/s" if expiry_rate else "not measured"
    lat = measure_lateness(bench, offered, seconds, warm)
    details["lateness"] = {**lat, "max_basis": basis}
    log(f"streams-punctuator lateness at {offered:,.0f}/s (half its {basis}): p50 {lat['p50']} ms, "
        f"p99 {lat['p99']} ms, early {lat['early']}, lost {lat['lost']}")
    return {
        "offered_rate": fig(offered, "records/s"),
        "max_basis": fig(maximum, "records/s",
                         note=f"the {basis}, the lower of the backlog drain ({rate or 0:,.0f}/s) and the "
                              f"mass-expiry drain ({expiry_s})"),
        **{f"{k}_ms": fig(lat[k], "ms") for k in ("p50", "p99", "p999", "max")},
        "early": fig(lat["early"], "records", "== 0"),
        "lost": fig(lat["lost"], "records", "== 0"),
        "duplicates": fig(lat["duplicates"], "records"),
    }


def run(bench: Bench) -> dict[str, Any]:
    if not installed():
        raise BenchError("streams-punctuator needs java and the Kafka Streams peer built into the cache: run "
                         "scripts/setup.sh (step 70-kafka-streams)")
    n, seconds = sizes(bench)
    counts = peers.pending_counts(bench, 50_000)
    rounds_n = throughput.rounds_for(bench)
    results: dict[str, Any] = {}
    details: dict[str, Any] = {}
    try:
        # -- throughput ---------------------------------------------------------------------------
        pre, target = peers.backlog(bench, n)
        warm = warm_up_topic(bench)
        host = start_host(bench, warm, pre, target, details)
        try:
            rounds = peers.rounds_after_warm_up(bench, lambda r: measure_round(bench, pre, target, r, host), details)
        finally:
            host.finish()
        details["rounds"] = rounds
        rates = [one[STREAMS]["records_per_s"] for one in rounds]
        rate = throughput.median(rates)
        note = f"median of {rounds_n} rounds" if rounds_n > 1 else None
        results[STREAMS] = {
            **peer_figures(rounds, STREAMS, rate, note,
                           "at-least-once: records forwarded again after a crash (none here)"),
            "cpu_us_per_record": fig(throughput.median([one[STREAMS]["cpu_us_per_record"] for one in rounds]), "us",
                                     note="the JVM's CPU from RUNNING on, median over rounds"),
            "changelog_records_per_record": fig(throughput.median(
                [one[STREAMS]["changelog_records_per_record"] for one in rounds]), "records",
                note="both stores' changelog topics, over N"),
        }
        for sched in bench.schedulers:
            ratio = throughput.median([one[sched]["ratio_to_streams"] for one in rounds])
            log(f"streams-punctuator: sidecar {sched} median {ratio or 0:.2f}x Kafka Streams")
            results[sched] = {"records_per_s": fig(throughput.one_median(rounds, sched), "records/s"),
                              "ratio_to_streams": fig(ratio, "x", ">= 2", note=note),
                              "cpu_us_per_record": fig(throughput.median(
                                  [one[sched]["cpu_us_per_record"] for one in rounds]), "us")}
        # -- mass expiry beside the sidecar's: before the lateness run, which offers half its drain --
        lead = expiry_lead_ms(bench)
        peer_expiry.beside(bench, "streams-punctuator", "sp", STREAMS, StreamsExpiry(bench, warm), lead, results,
                           details)
        # -- lateness at 50 % of the peer's own maximum: the lower of its two drains ------------------
        results["streams_lateness"] = lateness_at_half(bench, rate, seconds, warm, details)
        # -- pending memory and disk, restart after a crash with them pending ---------------------
        measure_pending(bench, counts[0], results, details)
        # -- cancel by id beside the sidecar's ------------------------------------------------------
        peer_cancel.beside(bench, "streams-punctuator", "sp", STREAMS, StreamsCancel(bench, warm), lead, results,
                           details)
        for more in counts[1:]:  # memory and disk at the further counts (10M), a fresh application each
            measure_pending(bench, more, results, details, restart=False)
    finally:
        bench.cleanup_topics()
    return {
        "method": "Kafka Streams (Processor API) application: a RocksDB store keyed by big-endian due ms + id "
                  f"and an id -> due store, both changelogged; a WALL_CLOCK_TIME punctuator every {PUNCTUATE_MS} ms "
                  "range-scans what is due, forwards it to its target (acks=all, idempotent) and deletes it; "
                  "at_least_once; the same all-due backlog as throughput, back to back with the sidecar in rotated "
                  "rounds, a fresh application each in one JVM kept for every round and drained unmeasured until its "
                  "CPU per record is steady; N records due in one ms stored, then drained, beside the sidecar's "
                  "mass-expiry drain; "
                  "lateness at 50 % of the lower of its two drains (the backlog's, all due on arrival, and the mass "
                  "expiry's: a 1-10 s delay takes the stored path); RSS and state directory per pending record; "
                  "restart after a SIGKILL with those records pending, to the first on-time delivery; half of N "
                  "pending cancelled by delay.cancel records, beside the sidecar's cancels",
        "settings": {"records": n, "rounds": rounds_n, "punctuate_ms": PUNCTUATE_MS, "lateness_seconds": seconds,
                     "mass_expiry_records": peer_expiry.records_for(bench), "lateness_delays_ms": WHEEL_DELAYS,
                     "pending_records": counts, "processing_guarantee": "at_least_once",
                     "producer": {"acks": "all", "enable.idempotence": True, "linger.ms": 2, "batch.size": 262_144},
                     "commit_interval_ms": "Streams default (30 000 for at_least_once)",
                     "record_cache": "none (the Processor API store default)", "jvm": JVM_OPTS,
                     "throughput_jvm": f"one for every round, drained unmeasured until the CPU per record of its last "
                                       f"{STEADY_RUNS} drains is within {STEADY_SPREAD:.0%} of their median "
                                       f"({WARM_RUNS_MAX} at most)",
                     "group_instance_id": "<application id>-0 (static membership)",
                     "schedulers": bench.schedulers},
        "results": results,
        "details": details,
    }
