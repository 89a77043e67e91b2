"""Scenario ``scale``: a large pending set grows while a 1 s stream keeps time.

Method: for each layout (the fill on one ingress partition, then on six), a sidecar runs on a
fresh ingress topic with one partition more than the fill uses. A paced stream of records with a
1 s delay (``STREAM_RATE``/s, 100 B) goes to the last partition for the whole run; the fill — N
records of 100 B due in 2 h (the last level: nothing falls due during the run) — is produced at a
paced ``--scale-rate`` (below the sidecar's capacity, so lateness measures pauses, not backlog)
round-robin over the fill partitions, with a pre-cancel (a ``delay.cancel`` of an id never sent)
every ``PRECANCEL_EVERY`` records; the sidecar runs with ``--cancel-horizon 5s`` so they expire
during the run. When the sidecar reports N pending, the bench samples its memory and the data
directory's allocated bytes, then kills it (SIGKILL) with the stream still running and starts it
again: the restart time is process spawn to the first stream record delivered on time (lateness
<= 50 ms) that was due after the spawn. After a graceful stop the expired pre-cancels still in
the id index are counted in the files (``IdIndex.precancels``).

Reported per layout: the stream's lateness (delivery CreateTime - ``delay.deliver-at``) p50, p99,
p99.9 and max over the fill, and per ``WINDOW_S`` window over time, each window with the longest GC
pause of the bench's broker that ended in it (its GC log: while the JVM is stopped nothing is
fetched or acknowledged, and its GC threads take the cores); the slowest loop turn (the
``stats`` lines' ``slowest_turn_ms``) and the ``loop.slow_turn`` events, and the latest wake
(``latest_wake_ms``: a wait for records that outlasted its timeout, ``loop.late_wake``); RSS and disk per pending
record (after - before the fill, / N); the restart time, and the stores' recovery in it (the
partitions open one after the other: their ``partition.recovered`` seconds summed, and each
with the seconds of its open's steps); the expired pre-cancels left.
Goals (issue 25, stated for 100M pending; the size run is in ``settings``): lateness p99.9 <= 50 ms
and max <= 100 ms, no loop turn over 50 ms, RSS <= 8 B and disk <= 320 B per pending record,
restart <= 5 s, no pre-cancel left that expired over ``SWEPT_WITHIN_S`` before the stop (the id
index's merge passes sweep them: one is cut at least every 30 s while records flow,
``idgrowth.CUT_S``, 60 s when other partitions' passes keep it waiting, and every 120 s when
none flow).

Size: ``--scale-pending N`` (per layout; default 30k small, 100M full: ~31 GB of disk and hours of
fill on a small machine, so give what fits); ``--scale-layouts 1,6`` the fill partitions per layout.
The sidecar runs with the changelog on (its default) unless ``--changelog off`` alone is given: at
100M pending the changelog topic holds another copy of every record on the broker's disk, which a
machine running the broker beside the sidecar may not have. Each layout's data directory is deleted
when its figures are taken.
The fill rate must stay below what the sidecar ingests on the machine: above it the consumer's
fetch queue fills with fill records and the stream's records wait behind them (lateness then
measures that backlog, not pauses).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

from bench.report import fig
from bench.workload import (
    Bench,
    KHeaders,
    SidecarProc,
    broker_gc_pauses,
    disk_usage,
    log,
    memory_of,
    percentile,
    producer,
    read_range,
    uid,
    value_of,
    wait_until,
    wall_ms,
)
from sidecar import contract as c
from sidecar.store.checkpoint import NAME as CHECKPOINT
from sidecar.store.idindex import IdIndex

FILL_DELAY_MS = 2 * 3_600_000  # the last default level
STREAM_DELAY_MS = 1000
STREAM_RATE = 500
PRECANCEL_EVERY = 1000
HORIZON = "5s"
HORIZON_MS = 5000
WINDOW_S = 10
STATS_S = 0.25  # the bench's sidecars' --stats-interval
ON_TIME_MS = 50
LAYOUTS = (1, 6)
SWEPT_WITHIN_S = 120  # an expired pre-cancel older than this (past its horizon) should be swept


def pending_for(bench: Bench) -> int:
    n = bench.options.get("scale_pending")
    return int(n) if n else (100_000_000 if bench.full else 30_000)


def layouts_for(bench: Bench) -> tuple[int, ...]:
    given = bench.options.get("scale_layouts")
    return tuple(given) if given else LAYOUTS


def rate_for(bench: Bench) -> float:
    return float(bench.options.get("scale_rate") or (40_000 if bench.full else 20_000))


class Paced(threading.Thread):
    """Produces ``rate`` records/s (5 ms ticks) to ``partitions`` round-robin until ``n`` are sent
    or :meth:`stop`; ``headers_of(i)`` gives record ``i``'s headers."""

    def __init__(self, bootstrap: str, topic: str, partitions: list[int], rate: float, n: int | None,
                 headers_of: Any, key_prefix: bytes) -> None:
        super().__init__(daemon=True)
        self.p: Any = producer(bootstrap, **{"delivery.report.only.error": True, "on_delivery": self._failed,
                                        "linger.ms": 1})
        self.topic, self.partitions, self.rate, self.n = topic, partitions, rate, n
        self.headers_of, self.prefix = headers_of, key_prefix
        self.value = value_of(100)
        self.sent = 0
        self.failed = 0
        self._stop_evt = threading.Event()

    def _failed(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.failed += 1

    def run(self) -> None:
        t0 = time.monotonic()
        parts, k = self.partitions, len(self.partitions)
        while not self._stop_evt.is_set() and (self.n is None or self.sent < self.n):
            want = int((time.monotonic() - t0) * self.rate)
            if self.n is not None:
                want = min(want, self.n)
            while self.sent < want:
                i = self.sent
                try:
                    self.p.produce(self.topic, self.value, b"%s%d" % (self.prefix, i), parts[i % k], None, None, 0,
                                   self.headers_of(i))
                except BufferError:
                    self.p.poll(0.01)
                    continue
                self.sent += 1
            self.p.poll(0)
            time.sleep(0.005)
        self.p.flush(120)
        # the client goes with its last reference: kept by this object, it would go on reconnecting
        # (and logging) after the bench has stopped the broker
        self.p = None

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(180)


def _lateness(ts: list[int], due: list[int]) -> dict[str, Any]:
    late = sorted(t - d for t, d in zip(ts, due, strict=True))
    return {"n": len(late), "p50": percentile(late, 50), "p99": percentile(late, 99),
            "p999": percentile(late, 99.9), "max": late[-1] if late else None,
            "early": sum(1 for x in late if x < 0)}


def _over_time(ts: list[int], due: list[int], t0: int) -> list[dict[str, Any]]:
    windows: dict[int, list[int]] = {}
    for t, d in zip(ts, due, strict=True):
        windows.setdefault((d - t0) // (WINDOW_S * 1000), []).append(t - d)
    out = []
    for w in sorted(windows):
        late = sorted(windows[w])
        out.append({"from_s": w * WINDOW_S, "n": len(late), "p50": percentile(late, 50), "p99": percentile(late, 99),
                    "p999": percentile(late, 99.9), "max": late[-1]})
    return out


def expired_precancels(data_dir: Path, ingress: str, partitions: int, before_ms: int) -> int:
    """Pre-cancels made before ``before_ms`` left in the stopped sidecar's id indexes."""
    n = 0
    for p in range(partitions):
        d = data_dir / f"{ingress}-{p}"
        if not (d / "ids.idx").exists():
            continue
        ck = json.loads((d / CHECKPOINT).read_text()) if (d / CHECKPOINT).exists() else None
        ix = IdIndex(d)
        try:
            ix.restore(ck.get("ids") if ck else None)
            n += ix.precancels(before_ms)
        finally:
            ix.close()
    return n


def next_stats(sc: SidecarProc, timeout_s: float = 60) -> None:
    """Wait until the sidecar has logged two more ``stats`` lines (``STATS_S`` apart): the second
    was written after the call, a loop turn that began after it."""
    seen = sum(1 for e in sc.poll_events() if e.get("event") == "stats")
    wait_until(f"{sc.name}: a stats line", lambda: sum(1 for e in sc.poll_events() if e.get("event") == "stats")
               >= seen + 2, timeout_s, 0.05, sc.check_alive)


def first_on_time(bench: Bench, topic: str, start: dict[int, int], due_from: int) -> int | None:
    """The record timestamp of the first record of ``topic`` after ``start`` due at ``due_from``
    or later and delivered on time (lateness 0 to ``ON_TIME_MS``), if any yet."""
    got = read_range(bench.bootstrap, topic, start, bench.wm.high(topic), headers=True)
    return min((t for t, d in zip(got.ts, got.deliver_at, strict=True) if d >= due_from and 0 <= t - d <= ON_TIME_MS),
               default=None)


def one_layout(bench: Bench, sched: str, fill_parts: int, n: int, rate: float) -> dict[str, Any]:
    ingress = f"bench.sc.in.{uid()}"
    target = f"bench.sc.out.{uid()}"
    stream_target = f"bench.sc.stream.{uid()}"
    parts = fill_parts + 1
    bench.topics(ingress, partitions=parts)
    bench.topics(target, stream_target)
    sc = bench.sidecar(ingress, sched, tag=f"scale{fill_parts}", partitions=parts,
                       extra=["--cancel-horizon", HORIZON], changelog=bench.other_changelog)
    sc.start(timeout_s=300)
    next_stats(sc)  # the baseline once the loop turns over its open partitions
    base = memory_of(sc.pid)
    tgt, stgt = target.encode(), stream_target.encode()
    fill_h: KHeaders = [(c.TARGET_TOPIC, tgt), (c.DELAY_MS, str(FILL_DELAY_MS).encode())]

    def fill_headers(i: int) -> KHeaders:
        if i % PRECANCEL_EVERY == PRECANCEL_EVERY - 1:
            return [(c.CANCEL, b"never-%d" % i)]
        return fill_h

    stream_h: KHeaders = [(c.TARGET_TOPIC, stgt), (c.DELAY_MS, str(STREAM_DELAY_MS).encode())]
    stream = Paced(bench.bootstrap, ingress, [fill_parts], STREAM_RATE, None, lambda _i: stream_h, b"s")
    fill = Paced(bench.bootstrap, ingress, list(range(fill_parts)), rate, n, fill_headers, b"f")
    started = wall_ms()
    stream.start()
    # the fill starts beside a stream that flows: its first record delivered
    wait_until("the stream's first delivery", lambda: bench.wm.total(stream_target) > 0, 120, 0.1, sc.check_alive)
    fill_t0 = wall_ms()
    fill.start()
    precancels = n // PRECANCEL_EVERY
    want = n - precancels  # pending: the fill's records, not its cancels
    deadline = time.monotonic() + n / rate * 3 + 600
    rss_peak = 0
    while True:
        sc.check_alive()
        rss_peak = max(rss_peak, memory_of(sc.pid).get("VmRSS", 0))
        st = sc.stats() or {}
        if int(st.get("pending", 0)) >= want + 0 and not fill.is_alive():
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the sidecar holds {st.get('pending')} of {want} pending in time")
        time.sleep(STATS_S)
    fill_t1 = wall_ms()
    next_stats(sc)  # memory and disk once the loop has reported a turn after the fill's last record
    after = memory_of(sc.pid)
    alloc, apparent = disk_usage(sc.data_dir)
    stats = [e for e in sc.poll_events() if e.get("event") == "stats"]
    slow = [e for e in sc.poll_events() if e.get("event") == "loop.slow_turn"]
    slowest = max((float(e.get("slowest_turn_ms") or 0) for e in stats), default=0.0)
    slow_turns = sum(int(e.get("slow_turns") or 0) for e in stats)
    # the waits for records that outlasted their timeout (no turn was slow, the loop woke late)
    latest_wake = max((float(e.get("latest_wake_ms") or 0) for e in stats), default=0.0)
    late_wakes = sum(int(e.get("late_wakes") or 0) for e in stats)
    wake_events = [e for e in sc.poll_events() if e.get("event") == "loop.late_wake"]
    # partitions held for an evicted id-table page (``stats``' count since the start, so the last)
    page_waits = max((int(e.get("page_waits") or 0) for e in stats), default=0)
    # the loop thread's own CPU in the logged slow turns (at most one a second is logged): a turn
    # long in wall time but short in CPU waited for a core (the machine's load), not for its work
    slow_cpu = max((float(e.get("user_ms") or 0) + float(e.get("system_ms") or 0) for e in slow), default=0.0)
    migrations = [e for e in sc.poll_events() if e.get("event") == "ids.grown"]
    # restart: SIGKILL with the stream running, start again, first on-time stream delivery
    sc.stop(signal.SIGKILL)
    from_offsets = bench.wm.high(stream_target)
    sc.start(wait=False)
    spawned = sc.started_ms
    sc.wait_event("partitions.assigned", 600)  # logged once every partition of the assignment is open
    recovered = [e for e in sc.poll_events() if e.get("event") == "partition.recovered"]
    wait_until("an on-time stream delivery due after the restart",
               lambda: first_on_time(bench, stream_target, from_offsets, spawned) is not None, 120, 0.5,
               sc.check_alive)
    stream.stop()
    stream_sent = stream.sent
    wait_until("the stream delivered", lambda: bench.wm.total(stream_target) >= stream_sent - 5, 120, 0.2,
               sc.check_alive)
    sc.stop()
    stopped = wall_ms()
    left = expired_precancels(sc.data_dir, ingress, parts, stopped - HORIZON_MS)
    left_old = expired_precancels(sc.data_dir, ingress, parts, stopped - HORIZON_MS - SWEPT_WITHIN_S * 1000)
    sc.wipe()  # ~31 GB at 100M pending: the next layout needs the disk
    got = read_range(bench.bootstrap, stream_target, {}, bench.wm.high(stream_target), headers=True)
    pairs = sorted(zip(got.ts, got.deliver_at, strict=True), key=lambda x: x[1])
    during = [(t, d) for t, d in pairs if fill_t0 <= d <= fill_t1]
    after_spawn = [t for t, d in pairs if d >= spawned and 0 <= t - d <= ON_TIME_MS]
    restart_s = (min(after_spawn) - spawned) / 1000 if after_spawn else None
    lat = _lateness([t for t, _ in during], [d for _, d in during])
    pauses = broker_gc_pauses(bench, fill_t0, fill_t1)
    windows = _over_time([t for t, _ in during], [d for _, d in during], fill_t0)
    for w in windows:  # the broker's longest GC pause ending in each window (0: none logged)
        lo = fill_t0 + w["from_s"] * 1000
        w["broker_gc_max_ms"] = max((ms for end, ms in pauses if lo <= end < lo + WINDOW_S * 1000), default=0.0)
    return {
        "fill_partitions": fill_parts, "pending": want, "fill_rate": rate, "fill_s": (fill_t1 - fill_t0) / 1000,
        "fill_sent": fill.sent, "fill_failed": fill.failed, "precancels_sent": precancels,
        "stream_sent": stream_sent, "stream_delivered": len(pairs), "stream_lost": max(0, stream_sent - len(pairs)),
        "lateness_during_fill_ms": lat, "lateness_over_time": windows,
        "broker_gc_pause_max_ms": max((ms for _, ms in pauses), default=None),
        "broker_gc_pauses_over_50ms": sum(1 for _, ms in pauses if ms > 50),
        "slowest_turn_ms": slowest, "slow_turns": slow_turns, "slow_turn_max_cpu_ms": slow_cpu,
        "slow_turn_events": slow[-20:], "latest_wake_ms": latest_wake, "late_wakes": late_wakes,
        "late_wake_events": wake_events[-20:], "page_waits": page_waits, "index_growths": [
            {k: e.get(k) for k in ("event", "capacity", "live", "s")} for e in migrations],
        "rss_baseline": base, "rss_after": after, "rss_peak": rss_peak,
        "disk_allocated": alloc, "disk_apparent": apparent,
        # the partitions open one after the other: their recoveries add up
        "restart_s": restart_s, "recovery_s": round(sum(float(e.get("seconds") or 0) for e in recovered), 3),
        "recovery_by_partition": {str(e.get("partition")): {"seconds": e.get("seconds"), "steps": e.get("steps")}
                                  for e in recovered},
        "expired_precancels_left": left, "expired_precancels_left_old": left_old, "started_ms": started,
        "run_s": (stopped - started) / 1000,
    }


def run(bench: Bench) -> dict[str, Any]:
    n, rate = pending_for(bench), rate_for(bench)
    results: dict[str, Any] = {}
    details: dict[str, Any] = {}
    for sched in bench.schedulers:
        results[sched], details[sched] = {}, {}
        for fill_parts in layouts_for(bench):
            log(f"scale {sched}: {n:,} pending on {fill_parts} partition(s) at {rate:,.0f}/s, a 1 s stream beside")
            m = one_layout(bench, sched, fill_parts, n, rate)
            lat, k = m["lateness_during_fill_ms"], m["pending"]
            rss = (m["rss_after"].get("VmRSS", 0) - m["rss_baseline"].get("VmRSS", 0)) / k
            label = f"{fill_parts}p"
            results[sched][label] = {
                "pending": fig(k, "records"),
                "stream_p50_ms": fig(lat["p50"], "ms"),
                "stream_p99_ms": fig(lat["p99"], "ms"),
                "stream_p999_ms": fig(lat["p999"], "ms", "<= 50"),
                "stream_max_ms": fig(lat["max"], "ms", "<= 100"),
                "stream_early": fig(lat["early"], "records", "== 0"),
                "stream_lost": fig(m["stream_lost"], "records", "== 0"),
                "slowest_turn_ms": fig(m["slowest_turn_ms"], "ms", "<= 50",
                                       note="any cause: see details.slow_turn_events for the phase"),
                "latest_wake_ms": fig(m["latest_wake_ms"], "ms",
                                      note="the longest wait for records past its timeout (the loop woke late: "
                                           "no core, or the GIL elsewhere); details.late_wake_events"),
                "slow_turn_max_cpu_ms": fig(m["slow_turn_max_cpu_ms"], "ms",
                                            note="user + system CPU of the loop thread in the logged slow turns"),
                "broker_gc_pause_max_ms": fig(m["broker_gc_pause_max_ms"], "ms",
                                              note="the bench's broker stopped for its GC: no fetch, no produce "
                                                   "answered (details: lateness_over_time.broker_gc_max_ms)"),
                "rss_bytes_per_pending": fig(rss, "B", "<= 8"),
                "disk_bytes_per_pending": fig(m["disk_allocated"] / k, "B", "<= 320"),
                "restart_to_first_on_time_s": fig(m["restart_s"], "s", "<= 5"),
                "restart_recovery_s": fig(m["recovery_s"], "s",
                                          note="the stores' open, summed over the partitions (details: "
                                               "recovery_by_partition, with each open's steps)"),
                "expired_precancels_left": fig(m["expired_precancels_left"], "records",
                                               note="past the horizon at the stop, not yet reached by a merge pass"),
                "expired_precancels_left_after_2min": fig(m["expired_precancels_left_old"], "records", "== 0",
                                                          note=f"expired over {SWEPT_WITHIN_S} s before the stop"),
            }
            if m["restart_s"] is None:
                results[sched][label]["restart_to_first_on_time_s"]["met"] = False
            details[sched][label] = m
            log(f"scale {sched} {label}: stream p99.9 {lat['p999']} ms, max {lat['max']} ms, slowest turn "
                f"{m['slowest_turn_ms']} ms, RSS {rss:.1f} B and disk {m['disk_allocated'] / k:.0f} B per pending, "
                f"restart {m['restart_s']} s, expired pre-cancels left {m['expired_precancels_left']}")
            bench.cleanup_topics()
    return {
        "method": "a 1 s stream (500/s) on one ingress partition while N far-future records fill one (then six) "
                  "other partitions at a paced rate; stream lateness over the fill, slowest loop turn, RSS and disk "
                  "per pending record, SIGKILL restart to the first on-time stream delivery, expired pre-cancels "
                  "left in the id index",
        "settings": {"pending_per_layout": n, "fill_rate": rate, "layouts": list(layouts_for(bench)),
                     "stream_rate": STREAM_RATE, "stream_delay_ms": STREAM_DELAY_MS, "fill_delay_ms": FILL_DELAY_MS,
                     "precancel_every": PRECANCEL_EVERY, "cancel_horizon": HORIZON, "schedulers": bench.schedulers,
                     "changelog": bench.other_changelog},
        "results": results,
        "details": details,
    }
