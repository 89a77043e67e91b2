"""Scenario ``mass-expiry``: N records due in the same millisecond.

Method: a sidecar runs on a fresh one-partition ingress topic. N records (100 B) are produced
with the *same* record timestamp T0 (set explicitly by the producer) and ``delay.ms`` = D (a
level time), so both schedulers commit every one of them to the same due time T0 + D: one level
queue run, or one wheel slot. The bench checks that all N are stored before T0 + D. From
T0 + D - 2 s a background producer offers a steady stream of new ingress records (30 min delay)
until the drain is over, and the sidecar's RSS is sampled every 50 ms.

* drain rate = N / (last delivered timestamp - (T0 + D)), next to the passthrough's rate for the
  same N records, measured right after each drain (seconds apart, as the throughput scenario
  takes its ratios: the machine's speed drifts by 20-30 % over the minutes a drain takes to set
  up, so one passthrough measured before every drain compared each with another machine);
* RSS growth = max RSS during the drain - RSS just before the due time (total and anon);
* ingest during the drain = the sidecar's ``ingested`` counter over the drain (from its stats
  lines, 250 ms apart), next to the offered background rate;
* lateness of the last record and the early count (must be 0).
"""

from __future__ import annotations

import statistics
from datetime import datetime
from typing import Any

from bench import throughput
from bench.report import fig
from bench.workload import (
    Bench,
    PacedProducer,
    Preloaded,
    RssSampler,
    SidecarProc,
    log,
    preload,
    read_range,
    sleep_until_wall_ms,
    uid,
    wait_until,
    wall_ms,
)

BACKGROUND_DELAY_MS = 1_800_000
LEVEL_TIMES = (1_000, 5_000, 10_000)  # the sidecar's first level times, the ones --max-delay allows
# --expiry-delay: the level times up to the full size's 4 minutes
EXPIRY_DELAYS_MS = (*LEVEL_TIMES, 30_000, 60_000, 120_000, 180_000, 240_000)


def params(bench: Bench) -> tuple[int, int, float]:
    """(records, delay ms, background ingest rate). ``--expiry-delay`` sets the delay (a level
    time); ``--max-delay`` cuts it to the longest level time up to it (the smoke test's 5 s: the
    wait for the due time is most of its run)."""
    n, delay_ms, bg_rate = (1_000_000, 240_000, 2_000.0) if bench.full else (10_000, 10_000, 1_000.0)
    return n, capped_delay(bench, expiry_delay(bench, delay_ms)), bg_rate


def expiry_delay(bench: Bench, default_ms: int) -> int:
    """The mass expiry's one delay: ``--expiry-delay``, else the size's ``default_ms``."""
    given = bench.options.get("expiry_delay_ms")
    return int(given) if given is not None else default_ms


def capped_delay(bench: Bench, delay_ms: int) -> int:
    """``delay_ms``, or under ``--max-delay`` the longest level time up to it (the first level
    time if none is): one delay due at once, as ``mass-expiry`` and ``tenants`` send it."""
    top = bench.options.get("max_delay_ms")
    if top is not None and top < delay_ms:
        return max((d for d in LEVEL_TIMES if d <= top), default=LEVEL_TIMES[0])
    return delay_ms


def _stats_ms(ev: dict[str, Any]) -> int:
    ts = str(ev.get("timestamp", ""))
    try:
        return int(datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return int(ev.get("_seen_ms", 0))


def ingest_rate_between(events: list[dict[str, Any]], t0: int, t1: int) -> float | None:
    """The ``ingested`` counter's slope over [t0, t1], from the stats lines that bracket it."""
    pts = [(_stats_ms(e), int(e.get("ingested", 0))) for e in events if e.get("event") == "stats"]
    before = [p for p in pts if p[0] <= t0]
    after = [p for p in pts if p[0] >= t1]
    if not before or not after or after[0][0] <= before[-1][0]:
        return None
    a, b = before[-1], after[0]
    return (b[1] - a[1]) / ((b[0] - a[0]) / 1000)


def preload_due_at_once(bench: Bench, sc: SidecarProc, ingress: str, n: int, target: str, delay_ms: int,
                        what: str) -> tuple[int, Preloaded, int]:
    """Produce ``n`` records into ``ingress`` with one timestamp T0 and one delay, and wait until
    the running sidecar ``sc`` stored them all: (their due time, the preload, when they were
    stored). ``what`` names them in the log."""
    t0 = wall_ms()
    due = t0 + delay_ms
    pre = preload(bench.bootstrap, ingress, n, 100, target, lambda _i: delay_ms, timestamp_ms=t0)
    wait_until(f"{n} {what} stored before their due time", lambda: sc.counter("ingested") >= n,
               max(1.0, (due - wall_ms()) / 1000), 0.1, sc.check_alive)
    stored = wall_ms()
    log(f"{what}: {n:,} stored {(due - stored) / 1000:.1f} s before their due time")
    return due, pre, stored


def drain_figures(n: int, pre: Preloaded, due: int, stored: int, last: int) -> dict[str, Any]:
    """A drain's figures: ``n`` records due at ``due``, stored at ``stored``, the last one
    delivered at ``last``."""
    drain_s = (last - due) / 1000
    return {"records": n, "preload_s": pre.seconds, "stored_before_due_s": (due - stored) / 1000,
            "drain_s": drain_s, "drain_rate": n / drain_s if drain_s > 0 else None}


def measure(bench: Bench, scheduler: str, n: int, delay_ms: int, bg_rate: float) -> dict[str, Any]:
    ingress, target, bg_target = f"bench.me.in.{uid()}", f"bench.me.out.{uid()}", f"bench.me.bg.{uid()}"
    bench.topics(ingress, target, bg_target)
    sc = bench.sidecar(ingress, scheduler, tag="me", changelog=bench.other_changelog)
    sc.start()
    sampler: RssSampler | None = None
    bg: PacedProducer | None = None
    try:
        due, pre, stored = preload_due_at_once(bench, sc, ingress, n, target, delay_ms, f"mass-expiry {scheduler}")
        sampler = RssSampler(sc.pid, 0.05)
        sampler.start()
        sleep_until_wall_ms(due - 2_000)
        bg = PacedProducer(bench.bootstrap, ingress, bg_target, bg_rate, 100, lambda _i: BACKGROUND_DELAY_MS)
        bg.start()
        wait_until(f"{n} records drained", lambda: bench.wm.total(target) >= n, 600, 0.1, sc.check_alive)
        seen_done = wall_ms()
    finally:
        if bg is not None:
            bg.stop()
        if sampler is not None:
            sampler.stop()
        sc.poll_events()
        sc.stop()
    got = read_range(bench.bootstrap, target, {}, bench.wm.high(target), headers=True)
    last = max(got.ts)
    before = [s for s in sampler.samples if due - 1_500 <= s[0] <= due - 500] or sampler.samples[:1]
    during = [s for s in sampler.samples if due - 500 <= s[0] <= last] or before
    rss0 = sum(s[1] for s in before) / len(before)
    anon0 = sum(s[2] for s in before) / len(before)
    return {
        **drain_figures(n, pre, due, stored, last),
        "first_lateness_ms": min(got.ts) - due,
        "last_lateness_ms": last - due,
        "early": sum(1 for ts, da in zip(got.ts, got.deliver_at, strict=True) if ts < da),
        "delivered": len(got.ts),
        "rss_before_mb": rss0 / 2**20,
        "rss_growth_mb": (max(s[1] for s in during) - rss0) / 2**20,
        "anon_growth_mb": (max(s[2] for s in during) - anon0) / 2**20,
        "offered_ingest_rate": bg_rate,
        "ingest_rate_during_drain": ingest_rate_between(sc.events, due, last),
        "seen_done_after_due_s": (seen_done - due) / 1000,
    }


def run(bench: Bench) -> dict[str, Any]:
    n, delay_ms, bg_rate = params(bench)
    pre, _target = throughput.preload_workload(bench, n, 100, "100B")
    results: dict[str, Any] = {}
    details: dict[str, Any] = {}
    pts: list[float] = []
    for sched in bench.schedulers:
        m = measure(bench, sched, n, delay_ms, bg_rate)
        # The baseline right after the drain it is compared with, seconds apart (the throughput
        # scenario's rule): measured once before every drain, it was minutes away from the later
        # ones, and this machine's speed drifts by 20-30 % in minutes.
        pt = throughput.measure_passthrough(bench, pre, f"me-{sched}")
        rate = pt["records_per_s"]
        if rate:
            pts.append(rate)
        ratio = m["drain_rate"] / rate if m["drain_rate"] and rate else None
        kept = m["ingest_rate_during_drain"]
        log(f"mass-expiry {sched}: drained {n:,} in {m['drain_s']:.1f} s ({m['drain_rate'] or 0:,.0f}/s, ratio "
            f"{ratio or 0:.2f} to the passthrough's {rate or 0:,.0f}/s right after), RSS "
            f"+{m['rss_growth_mb']:.1f} MiB, ingest during drain {kept or 0:,.0f}/s")
        m["passthrough"] = pt
        results[sched] = {
            "drain_records_per_s": fig(m["drain_rate"], "records/s"),
            "passthrough_records_per_s": fig(rate, "records/s",
                                             note="the same N records, measured right after the drain"),
            "drain_ratio_to_passthrough": fig(ratio, "x", ">= 0.8"),
            "rss_growth_mb": fig(m["rss_growth_mb"], "MiB", "<= 100"),
            "anon_growth_mb": fig(m["anon_growth_mb"], "MiB"),
            "ingest_during_drain_records_per_s": fig(kept, "records/s",
                                                     note=f"offered {bg_rate:,.0f} records/s in the background"),
            "ingest_kept_ratio": fig(kept / bg_rate if kept is not None else None, "x"),
            "first_record_lateness_ms": fig(m["first_lateness_ms"], "ms"),
            "last_record_lateness_ms": fig(m["last_lateness_ms"], "ms"),
            "early": fig(m["early"], "records", "== 0"),
        }
        details[sched] = m
    results["passthrough"] = {"records_per_s": fig(statistics.median(pts) if pts else None, "records/s",
                                                   note="median of the measurements after each drain")}
    bench.cleanup_topics()
    return {
        "method": "N records with one timestamp and one delay (one due millisecond); drain rate from the due time "
                  "to the last delivered timestamp vs a passthrough of the same N measured right after the "
                  "drain; RSS sampled every 50 ms",
        "settings": {"records": n, "delay_ms": delay_ms, "background_rate": bg_rate, "record_bytes": 100,
                     "schedulers": bench.schedulers},
        "results": results,
        "details": details,
    }
