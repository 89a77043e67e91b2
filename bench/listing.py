"""Scenario ``list``: how long a sidecar takes to list the records due in the next minute with N
pending (issue #53: the 1,000 records due in the next minute at 10M pending, p99 <= 100 ms).

Method: in-process, no broker (the read is the store's: ``sidecar.store.listing.list_store``, what
``GET /pending`` runs under the loop's store lock for each partition). One partition store per
scheduler, with the sidecar's default settings (the wheel: 10 ms slots, a 1 h window, 1 h buckets;
the levels: the default table), is filled through the loop's intake (``ingest_many``) with
N records of 100 B in ingress order: ``SOON`` (1,000) with ``delay.ms`` 1m and timestamps
spread over the last minute, so they fall due over the next minute, and the others with 1h and
2h and timestamps spread over the last 55 minutes, due between 5 minutes and 2 hours from
now (the wheel holds the ones within its hour in its slots and the rest in buckets). Then
``LISTS`` listings of ``[now, now + 1 min)`` with ``limit`` 1,000 are timed; each must return the
1,000 records due then, in due order (``wrong_answers``, goal 0), within ``EXAMINED`` units of
work (index entries examined and records decoded): the walk reads the minute, not the pending set.
Wall time is the goal's figure; the listing thread's CPU time is reported beside it (on a machine
shared with other work the wall time includes waiting for a core). The store is checkpointed
(without fsync) before the listings and its files' pages are in the page cache (just written): the
figure is the walk and the decoding, not the disk; the collector runs with the sidecar's settings
(``quiet_gc``).

Sizes: ``full`` N = 10,000,000 (the issue's), ``small`` N = 100,000; ``--list-pending`` sets N.
"""

from __future__ import annotations

import gc
import shutil
import time
from pathlib import Path
from typing import Any

from bench.append import open_store
from bench.report import fig
from bench.steady import _Msg as Msg
from bench.workload import Bench, BenchError, log, percentile, value_of, wall_ms
from sidecar import contract as c
from sidecar.config import Settings
from sidecar.engine.loop import quiet_gc
from sidecar.store.listing import Budget, Query, list_store
from sidecar.store.partition import IngressRecord, PartitionStore

GOAL_MS = "<= 100"
SOON = 1000
LISTS = 200
WINDOW_MS = 60_000
# work allowed per listing (index entries examined + records decoded): the 1,000 records and the
# minute's slots, not the pending set; a listing that needed more fails the run (TooWide)
EXAMINED = 20_000
INGRESS = "bench.list"
FAR = (b"3600000", b"7200000")  # the delays of the records not due soon (ms)


def records_for(bench: Bench) -> int:
    """N: the size's, or ``--list-pending``."""
    return bench.options.get("list_pending") or (10_000_000 if bench.full else 100_000)


_VALUE = value_of(100)


def fill(store: PartitionStore, n: int, now: int, far: tuple[bytes, ...] = FAR, batch: int = 1000) -> None:
    """``n`` records: ``SOON`` due in ``[now, now + 1 min)`` (``delay.ms`` 1m, the 1m level), the
    rest 5 min .. 2 h from now (delays ``far``: 1h and 2h), through the loop's intake (``Ingress.ingest``: the C
    fast path, the reference path for a record it leaves)."""
    target = (c.TARGET_TOPIC, b"bench.list.target")
    soon_every = max(1, n // SOON)
    back = 55 * 60_000
    soon = 0
    msgs: list[Any] = []
    for i in range(n):
        if i % soon_every == 0 and soon < SOON:
            ts, delay = now - WINDOW_MS + soon * (WINDOW_MS // SOON) + 1, b"60000"
            soon += 1
        else:
            ts, delay = now - back + i * back // n, far[i % len(far)]
        msgs.append(Msg(i, b"k%d" % i, _VALUE, [target, (c.DELAY_MS, delay), (c.ID, b"r%d" % i)], ts))
        if len(msgs) == batch or i == n - 1:
            j = 0
            while j < len(msgs):
                j = store.ingest_many(msgs, j, now, INGRESS)
                if j < len(msgs):
                    m = msgs[j]
                    store.ingest(IngressRecord(INGRESS, 0, m.offset(), m.timestamp()[1], m.key(), m.value(),
                                               m.headers()), now)
                    j += 1
            msgs = []


def measure(directory: Path, n: int, scheduler: str, lists: int = LISTS, far: tuple[bytes, ...] = FAR
            ) -> dict[str, Any]:
    store, counters = open_store(directory, Settings(scheduler=scheduler, ingress_topic=INGRESS, fsync="none"))
    collector = gc.get_threshold()
    try:
        now = wall_ms()
        t0 = time.perf_counter()
        fill(store, n, now, far)
        fill_s = time.perf_counter() - t0
        store.checkpoint(fsync=False)
        pending = sum(store.pending().values())
        if pending != n:
            raise BenchError(f"list {scheduler}: {pending} pending of {n} ingested "
                             f"({dict(counters.dlq)} dead-lettered)")
        q = Query(now, now + WINDOW_MS, limit=SOON)
        quiet_gc()  # the sidecar's collector settings (Sidecar.start)
        times: list[float] = []
        cpu: list[float] = []
        wrong = units = 0
        for _ in range(lists):
            t, tc = time.perf_counter(), time.thread_time()
            budget = Budget(EXAMINED)
            got = list_store(store, q, now, budget)
            units = EXAMINED - budget.left
            times.append((time.perf_counter() - t) * 1000)
            cpu.append((time.thread_time() - tc) * 1000)
            dues = [e.due_ms for e in got]
            if len(got) != SOON or dues != sorted(dues) or not all(now <= d < now + WINDOW_MS for d in dues):
                wrong += 1
    finally:
        gc.unfreeze()
        gc.set_threshold(*collector)
        store.close()
    times.sort()
    cpu.sort()
    return {"pending": n, "listed": SOON, "lists": lists, "wrong_answers": wrong, "fill_s": round(fill_s, 1),
            "p50_ms": round(percentile(times, 50) or 0, 3), "p99_ms": round(percentile(times, 99) or 0, 3),
            "max_ms": round(times[-1], 3), "cpu_p50_ms": round(percentile(cpu, 50) or 0, 3),
            "cpu_p99_ms": round(percentile(cpu, 99) or 0, 3), "work_units": units}


def run(bench: Bench) -> dict[str, Any]:
    n = records_for(bench)
    results: dict[str, Any] = {}
    details: dict[str, Any] = {}
    for scheduler in bench.schedulers:
        d = bench.workdir / f"list-{scheduler}"
        shutil.rmtree(d, ignore_errors=True)
        log(f"list: {scheduler}, filling {n:,} pending ...")
        try:
            res = measure(d, n, scheduler, LISTS, FAR)
        finally:
            shutil.rmtree(d, ignore_errors=True)
        log(f"list: {scheduler}: p99 {res['p99_ms']} ms, CPU p99 {res['cpu_p99_ms']} ms, "
            f"{res['work_units']} units, {res['wrong_answers']} wrong answers")
        results[scheduler] = {
            "pending": fig(n, "records"),
            "list_p50_ms": fig(res["p50_ms"], "ms"),
            "list_p99_ms": fig(res["p99_ms"], "ms", GOAL_MS),
            "list_cpu_p99_ms": fig(res["cpu_p99_ms"], "ms", note="CPU time of the listing thread: the share a "
                                                              "busy machine's other processes cannot inflate"),
            "wrong_answers": fig(res["wrong_answers"], "answers", "== 0"),
            "work_units": fig(res["work_units"], "units", note="index entries examined + 8 per record decoded, "
                                                               "per listing: the same at any N"),
        }
        details[scheduler] = res
    return {
        "method": "in-process, no broker: one partition store per scheduler (default settings) filled through "
                  "the loop's intake with N records, 1,000 of them due in the next minute; "
                  f"{LISTS} listings of [now, now + 1 min) with limit 1,000 (list_store: what GET /pending runs "
                  "per store), each timed (wall and CPU) and checked",
        "settings": {"records": n, "soon": SOON, "lists": LISTS, "schedulers": bench.schedulers},
        "results": results,
        "details": details,
        "notes": [] if bench.full else [f"small: {n:,} pending (the issue's goal is at 10,000,000: --size full)"],
    }
