"""Scenario ``exactly-once``: chaos under load with ``--delivery exactly-once``, counted by a
``read_committed`` consumer and confirmed by the Spark accuracy job: nothing lost, nothing
delivered twice, nothing early.

Method, per scheduler, one run on real sidecar processes (``python -m sidecar run --delivery
exactly-once``, the sidecar's default ``transaction-interval`` of 100 ms unless the bench is given
``--transaction-interval``) against the broker. The run has its own ingress
topic of ``PARTITIONS`` partitions, target topic, DLQ and changelog. A paced producer (``RATE``
records/s of 100 B, unique keys; levels: ``delay.ms`` 1 s or 5 s, level times; wheel: uniform
1-5 s) runs from the moment the first instance serves every partition until the last phase has
settled and ``DWELL_S`` (``--dwell``) more seconds have passed. A ``read_committed`` consumer of
the target tails it from the start and notes each record's arrival (wall clock): that is when a consumer
could act on it, which in this mode is the commit of the transaction that delivered it.

1. *crash loop*: instance A with default flags (no ``--group-instance-id``: it keeps the id it
   made in ``<data-dir>/instance-id``, so its restart fences its previous incarnation's
   transactional id), SIGKILLed ``KILLS`` times (``--crashes``) and restarted at once on the same
   data directory, a kill every ``CRASH_EVERY_S`` s after the previous spawn (and not before the new process has
   joined the group), after ``LEAD_S`` s of load; then until it serves every partition again.
2. *broker restart*: the broker the bench started is stopped (controlled shutdown) and started
   again on the same port and data directory, under load; the phase ends when the reader sees
   deliveries again. With an external broker (``--bootstrap-servers``) this phase is skipped and
   says so.
3. *scale-out*: instance B (default flags, its own data directory) joins the group; the phase ends
   when A and B serve every partition between them, then ``DWELL_S`` s of load.

After the load stops and every record is due, the bench waits until the reader has seen as many
distinct keys as the producer got acknowledged (or ``max delay + 90 s``), stops the instances
(SIGTERM) and counts, as the ``read_committed`` reader saw the target: sent, delivered (distinct
keys), lost (goal 0), duplicates (deliveries beyond the first of a key; goal 0), early (record
timestamp < ``delay.deliver-at``, the moment of publishing; goal 0), dead letters (DLQ records,
``read_committed``), lateness by record timestamp (the publish) and by arrival (the commit) p50 /
p99 / max. A ``read_uncommitted`` read of the target afterwards counts the records of aborted
transactions (deliveries a kill or the broker restart caught before their commit): at-least-once
delivery would have delivered those twice; 0 there means the chaos did not test anything.

Then the Spark accuracy job (``delay-sidecar accuracy --read-committed``, spark/accuracy.py, on a
local Spark with the Kafka connector) reads the ingress and target topics and reports its own
lost / duplicates / early over the run's time range: the same claim, from the tool users run.
Where pyspark is not installed (the package's ``spark`` extra) those figures are ``None`` with a
note.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from bench.failover import Member, alive_check, finish_load, wait_serving
from bench.report import fig
from bench.workload import (
    Bench,
    BenchError,
    CommittedReader,
    PacedProducer,
    choice_delays,
    cut_delays,
    dwell_s,
    log,
    percentile,
    sleep_until_wall_ms,
    uid,
    uniform_delays,
    wait_until,
    wall_ms,
)

PARTITIONS = 6  # the failover scenario's layout; wait_serving counts these
RATE = {"small": 500.0, "full": 5_000.0}
KILLS = {"small": 3, "full": 10}
CRASH_EVERY_S = 2.0
LEAD_S = {"small": 3.0, "full": 15.0}
DWELL_S = {"small": 3.0, "full": 20.0}
LEVEL_DELAYS = (1_000, 5_000)
WHEEL_DELAYS = (1_000, 5_000)
RESUME_TIMEOUT_S = 180.0
SPARK_TIMEOUT_S = 600.0


def count_all(bootstrap: str, topic: str, partitions: int, isolation: str, quiet_s: float = 3.0,
              timeout_s: float = 120.0) -> int:
    """Records of ``topic`` a consumer with ``isolation`` reads from the start to the end (every
    partition's position at its high watermark, or nothing new for ``quiet_s``)."""
    cons = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-eos-count-{uid()}",
                     "enable.auto.commit": False, "isolation.level": isolation, "fetch.max.bytes": 52_428_800})
    tps = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)]
    cons.assign(tps)
    marks = {p: cons.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
             for p in range(partitions)}
    # an empty partition (a DLQ nothing went to) has no position to reach: waiting for one took quiet_s
    high = {p: int(hi) for p, (lo, hi) in marks.items() if hi > lo}
    n = 0
    quiet_since = deadline = time.monotonic()
    deadline += timeout_s
    try:
        while time.monotonic() < deadline and time.monotonic() - quiet_since < quiet_s:
            msgs = [m for m in cons.consume(num_messages=10_000, timeout=0.2) if m.error() is None]
            if msgs:
                quiet_since = time.monotonic()
                n += len(msgs)
            pos = {tp.partition: tp.offset for tp in cons.position(tps)}
            if all(pos.get(p, -1) >= h for p, h in high.items()):
                break
    finally:
        cons.close()
    return n


def spark_accuracy(bench: Bench, ingress: str, target: str, since_ms: int, until_ms: int,
                   tag: str) -> dict[str, Any]:
    """The Spark accuracy job's totals over ``[since_ms, until_ms)`` of ``ingress`` joined with
    ``target``, read ``read_committed``; ``{"skipped": why}`` without pyspark."""
    if importlib.util.find_spec("pyspark") is None:
        return {"skipped": "pyspark is not installed (the package's spark extra)"}
    out_dir = bench.workdir / f"accuracy-{tag}"
    cmd = [sys.executable, "-m", "sidecar", "accuracy", "--bootstrap-servers", bench.bootstrap,
           "--ingress-topic", ingress, "--targets", re.escape(target), "--since", str(since_ms),
           "--until", str(until_ms), "--read-committed", "--json", "--no-chart", "--no-details",
           "--out", str(out_dir), "--master", "local[2]"]
    env = dict(os.environ)
    if not bench.full:
        # a smoke's job reads a few thousand records: the JVM's first tier compiles enough, and
        # skipping the optimizing tier halves the job's time here (as tests/spark/conftest.py does)
        env["JAVA_TOOL_OPTIONS"] = f"{env.get('JAVA_TOOL_OPTIONS', '')} -XX:TieredStopAtLevel=1".strip()
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SPARK_TIMEOUT_S, check=False, env=env)
    if proc.returncode != 0:
        raise BenchError(f"the Spark accuracy job exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    start = proc.stdout.find("{")
    if start < 0:
        raise BenchError(f"the Spark accuracy job printed no JSON:\n{proc.stdout[-2000:]}")
    summary = orjson.loads(proc.stdout[start:])
    totals = summary["totals"]
    return {"isolation_level": summary.get("isolation_level"), "seconds": round(time.monotonic() - t0, 1),
            **{k: totals.get(k) for k in ("sent", "delivered", "lost", "pending", "duplicates", "early",
                                          "unmatched")},
            "lateness_ms": totals.get("lateness_ms")}


def delays_ms(bench: Bench) -> tuple[tuple[int, ...], tuple[int, int]]:
    """(the level times levels is sent, the wheel's uniform range), cut at ``--max-delay`` (the
    smoke test's shorter tail after the load)."""
    return cut_delays(LEVEL_DELAYS, WHEEL_DELAYS, bench.options.get("max_delay_ms"))


def kills(bench: Bench) -> int:
    """The crash loop's SIGKILLs: ``--crashes``, else ``KILLS`` of the size."""
    k = bench.options.get("crashes")
    return KILLS[bench.size] if k is None else int(k)


def _sidecar(bench: Bench, label: str, ingress: str, scheduler: str, group: str, dlq: str) -> Member:
    sc = bench.sidecar(ingress, scheduler, tag=f"eos-{label}", delivery="exactly-once", group=group,
                       static_id=False, partitions=PARTITIONS, dlq=dlq, session_timeout_ms=None)
    return Member(label, sc)


def chaos_run(bench: Bench, scheduler: str) -> dict[str, Any]:
    ingress, target = f"bench.eos.in.{uid()}", f"bench.eos.out.{uid()}"
    group, dlq = f"bench-eos-{uid()}", f"bench.eos.dlq.{uid()}"
    bench.topics(ingress, partitions=PARTITIONS)
    bench.topics(target, dlq)
    a = _sidecar(bench, "A", ingress, scheduler, group, dlq)
    b = _sidecar(bench, "B", ingress, scheduler, group, dlq)
    members = [a, b]
    reader = CommittedReader(bench.bootstrap, target, {0: OFFSET_BEGINNING}, collect=True, keys=True)
    reader.start()
    levels, wheel = delays_ms(bench)
    delays = choice_delays(levels) if scheduler == "levels" else uniform_delays(*wheel)
    max_delay = max(*levels, wheel[1])
    phases: dict[str, Any] = {}
    dwell = dwell_s(bench, DWELL_S)

    alive = alive_check(members)
    a.start()
    wait_serving([a])
    prod = PacedProducer(bench.bootstrap, ingress, target, RATE[bench.size], 100, delays, key_prefix=f"e{uid()}-")
    prod.start()
    try:
        time.sleep(LEAD_S[bench.size])
        # 1. crash loop
        t0 = wall_ms()
        for _k in range(kills(bench)):
            sleep_until_wall_ms(a.sc.started_ms + int(CRASH_EVERY_S * 1000))
            a.sc.wait_event("partitions.assigned", 120)
            a.end(signal.SIGKILL)
            a.start()
        ready = wait_serving([a])
        phases["crash_loop"] = {"kills": kills(bench), "seconds": (ready - t0) / 1000,
                                "last_kill_to_serving_s": (ready - a.sc.started_ms) / 1000}
        log(f"exactly-once {scheduler}: {kills(bench)} SIGKILLs; serving again {(ready - t0) / 1000:.1f} s "
            "after the first")
        time.sleep(dwell)
        # 2. broker restart
        if bench.broker is None:
            phases["broker_restart"] = {"skipped": "external broker (--bootstrap-servers): not restarted"}
        else:
            t0 = wall_ms()
            bench.broker.restart(timeout=240)
            up = wall_ms()
            seen = reader.got.seen_ms
            wait_until("deliveries after the broker restart", lambda: bool(seen) and seen[-1] >= up,
                       RESUME_TIMEOUT_S, 0.1, alive)
            resumed = wall_ms()
            phases["broker_restart"] = {"broker_down_s": (up - t0) / 1000,
                                        "broker_up_to_delivery_s": (resumed - up) / 1000}
            log(f"exactly-once {scheduler}: broker restarted in {(up - t0) / 1000:.1f} s; deliveries seen again "
                f"{(resumed - up) / 1000:.1f} s later")
        time.sleep(dwell)
        # 3. scale-out
        t0 = wall_ms()
        b.start()
        ready = wait_serving(members)
        phases["scale_out"] = {"seconds": (ready - t0) / 1000}
        log(f"exactly-once {scheduler}: scale-out 1 -> 2 served in {(ready - t0) / 1000:.1f} s")
        time.sleep(dwell)
    except BaseException:
        prod.stop()
        reader.stop()
        raise
    # at most max delay + 90 s: the last restore after a scale-out can take a while at full size
    waited = finish_load(bench, prod, target, members, lambda: len(reader.distinct), max_delay / 1000 + 90)
    time.sleep(1.0)
    reader.stop()
    until_ms = wall_ms()
    res = analyse(reader, prod)
    res["dead_letters"] = count_all(bench.bootstrap, dlq, 1, "read_committed")
    written = count_all(bench.bootstrap, target, 1, "read_uncommitted")
    res["read_uncommitted_records"] = written
    res["aborted_records"] = written - res["deliveries"]
    res["spark"] = spark_accuracy(bench, ingress, target, prod.started_ms - 1_000, until_ms, scheduler)
    aborts = [str(ev.get("reason", "?"))[:200] for m in members for ev in m.events()
              if ev.get("event") == "transaction.aborted"]
    return {**res, "delivery_wait": waited, "phases": phases, "rate": RATE[bench.size],
            "load_s": (prod.stopped_ms - prod.started_ms) / 1000, "aborts_logged": len(aborts),
            "abort_reasons_sample": aborts[:5]}


def analyse(reader: CommittedReader, prod: PacedProducer) -> dict[str, Any]:
    prefix = prod.key_prefix.encode()
    plen = len(prefix)

    def was_sent(k: bytes) -> bool:
        tail = k[plen:]
        return k.startswith(prefix) and tail.isdigit() and int(tail) < prod.sent

    got = reader.got
    counts = Counter(got.keys)
    delivered = sum(1 for k in counts if was_sent(k))
    late = sorted(ts - da for ts, da in zip(got.ts, got.deliver_at, strict=True))
    seen = sorted(at - da for at, da in zip(got.seen_ms, got.deliver_at, strict=True))
    return {
        "sent": prod.accepted,
        "produce_failed": prod.failed,
        "delivered": delivered,
        "deliveries": len(got.keys),
        "lost": max(0, prod.accepted - delivered),
        "duplicates": len(got.keys) - len(counts),
        "early": sum(1 for x in late if x < 0),
        "unknown_keys": len(counts) - delivered,
        "lateness_ms": {"p50": percentile(late, 50), "p99": percentile(late, 99), "max": late[-1] if late else None},
        "visible_lateness_ms": {"p50": percentile(seen, 50), "p99": percentile(seen, 99),
                                "max": seen[-1] if seen else None},
    }


def _spark_figures(sp: dict[str, Any]) -> dict[str, Any]:
    note = sp.get("skipped")
    return {k: fig(None if note else sp.get(k), "records", "== 0", note=note)
            for k in ("lost", "duplicates", "early")} | {"sent": fig(sp.get("sent"), "records", note=note)}


def run(bench: Bench) -> dict[str, Any]:
    results: dict[str, Any] = {}
    details: dict[str, Any] = {}
    for sched in bench.schedulers:
        log(f"exactly-once {sched}: {kills(bench)} SIGKILLs, a broker restart, a scale-out, under load ...")
        r = chaos_run(bench, sched)
        log(f"exactly-once {sched}: sent {r['sent']}, lost {r['lost']}, duplicates {r['duplicates']}, early "
            f"{r['early']} (read_committed); {r['aborted_records']} records in aborted transactions; spark "
            f"{ {k: r['spark'].get(k) for k in ('lost', 'duplicates', 'early', 'skipped') if k in r['spark']} }")
        restart = r["phases"].get("broker_restart", {})
        results[sched] = {
            "sent": fig(r["sent"], "records"),
            "lost": fig(r["lost"], "records", "== 0"),
            "duplicates": fig(r["duplicates"], "records", "== 0", note="as a read_committed consumer sees them"),
            "early": fig(r["early"], "records", "== 0"),
            "dead_letters": fig(r["dead_letters"], "records"),
            "aborted_records": fig(r["aborted_records"], "records",
                                   note="read_uncommitted minus read_committed: deliveries whose transaction aborted"),
            "lateness_p99_ms": fig(r["lateness_ms"]["p99"], "ms", note="record timestamp - delay.deliver-at"),
            "visible_lateness_p99_ms": fig(r["visible_lateness_ms"]["p99"], "ms",
                                           note="arrival at a read_committed consumer - delay.deliver-at, "
                                                "chaos included"),
            "broker_restart_to_delivery_s": fig(restart.get("broker_up_to_delivery_s"), "s",
                                                note=restart.get("skipped")),
            "spark": _spark_figures(r["spark"]),
        }
        details[sched] = r
        bench.cleanup_topics()
    return {
        "method": "a paced load through sidecars in exactly-once mode while one crash-loops (SIGKILL x N), the "
                  "broker restarts and a second instance joins; a read_committed consumer of the target counts "
                  "lost, duplicates and early deliveries, and the Spark accuracy job (--read-committed) confirms",
        "settings": {"partitions": PARTITIONS, "rate": RATE[bench.size], "kills": kills(bench),
                     "crash_every_s": CRASH_EVERY_S, "lead_s": LEAD_S[bench.size], "dwell_s": dwell_s(bench, DWELL_S),
                     "levels_delays_ms": delays_ms(bench)[0], "wheel_delays_ms": delays_ms(bench)[1],
                     "record_bytes": 100,
                     "transaction_interval_ms": bench.transaction_interval_ms,
                     "broker_restart": bench.broker is not None,
                     "schedulers": bench.schedulers},
        "results": results,
        "details": details,
    }

