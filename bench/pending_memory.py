"""Scenario ``pending-memory``: RSS and disk bytes per pending record.

Method: a sidecar starts on a fresh one-partition ingress topic; once its partition is assigned
and it has idled for 2 s, its memory is sampled (the baseline). Then N records (100 B values,
``delay.ms`` = 30 min, a level time, so nothing falls due during the measurement) are produced
into the ingress topic while the sidecar runs; when its ``stats`` line reports N pending, the
bench waits 2 s and samples again. Per pending record = (after - baseline) / N for:

* ``rss`` — VmRSS, what ``ps``/Kubernetes show. It includes the file pages of the store's
  mmapped files (commit log, level queues / wheel, id index) that the process touched: those
  are page cache, shared with the kernel's cache and reclaimable under memory pressure, but they
  do count in RSS;
* ``anon`` — RssAnon: the Python heap and every other private allocation (what would have to
  be swapped; what a "pending messages in a dict" design pays);
* ``file`` — RssFile: the mapped file pages (see above);
* ``uss`` — private pages (smaps_rollup Private_Clean + Private_Dirty).

Disk: bytes allocated under the data directory (the segment files are preallocated sparse files,
so allocated < apparent size) and the apparent size, per pending record.

Two "after" samples: ``loaded`` (the process that just ingested the N records: its RSS also holds
the intake's high-water marks, e.g. librdkafka's fetch queue of up to 64 MiB and the allocator's
arenas) and ``reopened`` (the same store opened by a fresh process after a graceful stop: what N
pending records cost a running sidecar). The goal (<= 8 B RSS per pending record) is judged on
total RSS for both; anon is judged and shown next to it.
Full size asks for 1M and 10M pending within a budget of 15 minutes for the scenario (split
between the schedulers); when the ingest rate measured while loading 1M says 10M does not fit,
the larger count is scaled down to what fits (in steps of 500k) and the report's ``notes`` say so.
"""

from __future__ import annotations

import time
from typing import Any

from bench.report import fig
from bench.workload import (
    Bench,
    SidecarProc,
    disk_usage,
    log,
    memory_of,
    preload,
    uid,
    wall_ms,
)

PENDING_DELAY_MS = 1_800_000  # 30 min: a level time, inside the wheel's default window
GOAL_RSS = "<= 8"
BUDGET_S = 15 * 60


def counts_for(bench: Bench) -> list[int]:
    return [1_000_000, 10_000_000] if bench.full else [100_000]


def build_pending(bench: Bench, scheduler: str, n: int, tag: str = "pm") -> tuple[SidecarProc, dict[str, Any]]:
    """A running sidecar with ``n`` records pending (and its memory before and after loading)."""
    ingress = f"bench.pm.in.{uid()}"
    target = f"bench.pm.out.{uid()}"
    bench.topics(ingress, target)
    sc = bench.sidecar(ingress, scheduler, tag=tag, changelog=bench.other_changelog)
    sc.start()
    time.sleep(2)
    base = memory_of(sc.pid, rollup=True)
    t0 = wall_ms()
    pre = preload(bench.bootstrap, ingress, n, 100, target, lambda _i: PENDING_DELAY_MS)
    produced_s = (wall_ms() - t0) / 1000
    log(f"pending-memory {scheduler}: produced {n:,} in {produced_s:.0f} s, waiting for the sidecar to store them")
    deadline = time.monotonic() + max(600, n / 2_000)
    while True:
        sc.check_alive()
        st = sc.stats() or {}
        if int(st.get("pending", 0)) >= n and int(st.get("ingested", 0)) >= n:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the sidecar stored {st.get('pending')} of {n} pending records in time")
        time.sleep(0.5)
    loaded_s = (wall_ms() - t0) / 1000
    time.sleep(2)
    after = memory_of(sc.pid, rollup=True)
    alloc, apparent = disk_usage(sc.data_dir)
    # The same store in a fresh process: what N pending cost without the intake's high-water marks
    # (librdkafka's fetch queue, the allocator's arenas).
    sc.stop()
    sc.start(timeout_s=600)
    time.sleep(2)
    reopened = memory_of(sc.pid, rollup=True)
    info = {"n": n, "baseline": base, "after": after, "reopened": reopened, "disk_allocated": alloc,
            "disk_apparent": apparent,
            "produce_s": produced_s, "load_s": loaded_s, "ingest_rate": n / loaded_s, "target": target,
            "preload_s": pre.seconds}
    return sc, info


def per_record(info: dict[str, Any], which: str) -> dict[str, Any]:
    n = info["n"]
    b, a = info["baseline"], info[which]

    def d(key: str) -> float | None:
        return (a[key] - b[key]) / n if key in a and key in b else None

    uss_a = a.get("Private_Clean", 0) + a.get("Private_Dirty", 0)
    uss_b = b.get("Private_Clean", 0) + b.get("Private_Dirty", 0)
    return {
        "rss_bytes_per_pending": fig(d("VmRSS"), "B", GOAL_RSS),
        "anon_bytes_per_pending": fig(d("RssAnon"), "B", GOAL_RSS,
                                      note="RssAnon: private heap; the goal is stated for RSS, shown here too"),
        "file_bytes_per_pending": fig(d("RssFile"), "B", note="mmapped store pages counted in RSS"),
        "uss_bytes_per_pending": fig((uss_a - uss_b) / n, "B"),
        "rss_mb": fig(a.get("VmRSS", 0) / 2**20, "MiB"),
    }


def run(bench: Bench) -> dict[str, Any]:
    asked = counts_for(bench)
    results: dict[str, Any] = {}
    details: dict[str, Any] = {}
    notes: list[str] = []
    for sched in bench.schedulers:
        results[sched] = {}
        details[sched] = {}
        rate: float | None = None
        budget = BUDGET_S / max(1, len(bench.schedulers))
        started = time.monotonic()
        for n_asked in asked:
            n = n_asked
            left = budget - (time.monotonic() - started)
            if rate is not None and n / rate > left:
                n = int(rate * left) // 500_000 * 500_000
                if n <= asked[0]:
                    notes.append(f"{sched}: {n_asked:,} pending does not fit the time left ({left / 60:.0f} of "
                                 f"{budget / 60:.1f} min) at {rate:,.0f} records/s; skipped")
                    continue
                notes.append(f"{sched}: {n_asked:,} pending scaled down to {n:,}, what fits the time left "
                             f"({left / 60:.1f} of {budget / 60:.1f} min) at the measured {rate:,.0f} records/s ingest")
            sc, info = build_pending(bench, sched, n)
            rate = info["ingest_rate"]
            label = f"{n / 1_000_000:g}M" if n >= 1_000_000 else f"{n / 1000:g}k"
            results[sched][label] = {
                "loaded": per_record(info, "after"),
                "reopened": per_record(info, "reopened"),
                "disk_allocated_bytes_per_pending": fig(info["disk_allocated"] / n, "B"),
                "disk_apparent_bytes_per_pending": fig(info["disk_apparent"] / n, "B"),
                "ingest_rate": fig(info["ingest_rate"], "records/s"),
            }
            details[sched][label] = info
            r = results[sched][label]
            log(f"pending-memory {sched} {label}: RSS {r['loaded']['rss_bytes_per_pending']['value']} B "
                f"(reopened {r['reopened']['rss_bytes_per_pending']['value']} B), anon "
                f"{r['loaded']['anon_bytes_per_pending']['value']} B (reopened "
                f"{r['reopened']['anon_bytes_per_pending']['value']} B), disk "
                f"{r['disk_allocated_bytes_per_pending']['value']} B per pending record")
            bench.results.setdefault("pending-memory-per-record", {})[sched] = {
                "n": n, "rss_loaded": r["loaded"]["rss_bytes_per_pending"]["value"],
                "rss_reopened": r["reopened"]["rss_bytes_per_pending"]["value"],
                "anon_reopened": r["reopened"]["anon_bytes_per_pending"]["value"],
            }
            sc.stop()
            # Kept for the restart scenario: the largest store of each scheduler.
            bench.results.setdefault("pending-stores", {})[sched] = (sc, n)
    return {
        "method": "sidecar RSS (VmRSS, RssAnon, RssFile, USS) and data-dir disk bytes before and after N records "
                  "pending (30 min delay), divided by N",
        "settings": {"counts": asked, "record_bytes": 100, "delay_ms": PENDING_DELAY_MS,
                     "schedulers": bench.schedulers},
        "results": results,
        "details": details,
        "notes": notes,
    }
