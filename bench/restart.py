"""Scenario ``restart``: process start to the first on-time delivery with N records pending.

Method: a sidecar holds N pending records (100 B, 30 min delay; the store the ``pending-memory``
scenario built when it ran in the same invocation, else one built here). It is killed with
SIGKILL at time P (a crash, not a graceful stop: recovery replays from the last checkpoint). Then
the bench sends probe records into the ingress topic every 50 ms for W seconds with a delay D
(a level time, so both schedulers commit exactly ``send time + D``), and starts the sidecar again
at S = P + D, the moment the first probe falls due. Probes therefore fall due every 50 ms from S
to S + W. The restart time is ``first on-time probe delivery - S``, where on time means lateness
(record timestamp - ``delay.deliver-at``) <= 50 ms: the sidecar is back and keeping time. Probes
due before it was ready are delivered late, never early, and are reported too. Resolution 50 ms;
a restart longer than W is reported as not measured.
"""

from __future__ import annotations

import signal
import time
from typing import Any

from confluent_kafka import Producer

from bench.pending_memory import build_pending
from bench.report import fig
from bench.workload import (
    Bench,
    SidecarProc,
    ingress_headers,
    log,
    producer,
    read_range,
    sleep_until_wall_ms,
    uid,
    value_of,
    wait_until,
    wall_ms,
)

STEP_MS = 50
ON_TIME_MS = 50


def counts_for(bench: Bench) -> int:
    return 10_000_000 if bench.full else 100_000


def send_probes(p: Producer, ingress: str, target: str, delay_ms: int, window_ms: int) -> int:
    value = value_of(100)
    start = wall_ms()
    k = 0
    while True:
        at = start + k * STEP_MS
        if at > start + window_ms:
            break
        sleep_until_wall_ms(at)
        p.produce(ingress, value=value, key=f"probe{k}".encode(), headers=ingress_headers(target, delay_ms))
        p.poll(0)
        k += 1
    if p.flush(60):
        raise RuntimeError("probes were not acknowledged")
    return k


def measure(bench: Bench, sc: SidecarProc, n: int) -> dict[str, Any]:
    delay_ms = 30_000 if bench.full else 10_000
    window_ms = delay_ms - 2_000
    target = f"bench.rs.probe.{uid()}"
    bench.topics(target)
    if sc.proc is None or sc.proc.poll() is not None:
        sc.start(timeout_s=600)
        time.sleep(2)
    p = producer(bench.bootstrap, **{"linger.ms": 0})
    p.list_topics(timeout=30)
    killed = wall_ms()
    sc.stop(signal.SIGKILL)
    sent = send_probes(p, sc.ingress, target, delay_ms, window_ms)
    sleep_until_wall_ms(killed + delay_ms)
    sc.start(wait=False)
    spawned = sc.started_ms
    try:
        assigned = sc.wait_event("partitions.assigned", 600)
        recovered = sc.last("partition.recovered") or {}
        wait_until(f"{sent} probes delivered", lambda: bench.wm.total(target) >= sent, window_ms / 1000 + 300, 0.1,
                   sc.check_alive)
    finally:
        sc.stop()
    got = read_range(bench.bootstrap, target, {}, bench.wm.high(target), headers=True)
    pairs = sorted(zip(got.ts, got.deliver_at, strict=True), key=lambda x: x[1])
    on_time = [ts for ts, da in pairs if 0 <= ts - da <= ON_TIME_MS]
    late = [ts - da for ts, da in pairs if ts - da > ON_TIME_MS]
    first_on_time = min(on_time) if on_time else None
    return {
        "pending": n,
        "probes": sent,
        "probe_delay_ms": delay_ms,
        "probe_window_ms": window_ms,
        "restart_s": (first_on_time - spawned) / 1000 if first_on_time else None,
        "first_delivery_s": (min(got.ts) - spawned) / 1000 if got.ts else None,
        "assigned_seen_s": (assigned["_seen_ms"] - spawned) / 1000,
        "recovery_s": recovered.get("seconds"),
        "probes_late": len(late),
        "max_late_ms": max(late) if late else 0,
        "early": sum(1 for ts, da in pairs if ts < da),
        "replayed_resume_offset": recovered.get("resume_offset"),
    }


def run(bench: Bench) -> dict[str, Any]:
    results: dict[str, Any] = {}
    details: dict[str, Any] = {}
    stores = bench.results.get("pending-stores", {})
    for sched in bench.schedulers:
        if sched in stores:
            sc, n = stores[sched]
            source = "store built by pending-memory"
        else:
            n = counts_for(bench)
            sc, _info = build_pending(bench, sched, n, tag="rs")
            source = "store built here"
        log(f"restart {sched}: {n:,} pending ({source}), SIGKILL, probes, restart ...")
        m = measure(bench, sc, n)
        log(f"restart {sched}: first on-time delivery {m['restart_s']} s after process start "
            f"(first delivery {m['first_delivery_s']} s, recovery {m['recovery_s']} s)")
        note = None if m["restart_s"] is not None else (
            f"no on-time probe within the {m['probe_window_ms'] / 1000:.0f} s probe window: the restart took longer "
            "(see restart_to_first_delivery_s)")
        on_time = fig(m["restart_s"], "s", "<= 5", note=note)
        if m["restart_s"] is None:
            on_time["met"] = False  # longer than the probe window, so longer than the goal too
        results[sched] = {
            "pending": fig(n, "records"),
            "restart_to_first_on_time_s": on_time,
            "restart_to_first_delivery_s": fig(m["first_delivery_s"], "s"),
            "store_recovery_s": fig(m["recovery_s"], "s", note="partition.recovered: opening the store"),
            "early": fig(m["early"], "records", "== 0"),
        }
        details[sched] = {**m, "store": source}
    bench.results.pop("pending-stores", None)
    bench.cleanup_topics()
    return {
        "method": "SIGKILL with N pending, probes due every 50 ms from the restart on; time from process spawn to "
                  "the first probe delivered with lateness <= 50 ms",
        "settings": {"pending": counts_for(bench), "step_ms": STEP_MS, "on_time_ms": ON_TIME_MS,
                     "schedulers": bench.schedulers},
        "results": results,
        "details": details,
    }
