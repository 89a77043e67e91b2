"""Scenario ``recurring``: many recurring schedules firing beside a stream of 1 s delays.

Method: a sidecar runs on a fresh one-partition ingress topic. N schedules are produced, each
``delay.every`` = P with its ``delay.start`` spread evenly over one period (schedule i starts at
T0 + i * P / N), so the sidecar fires N / P firings per second, steadily. Beside them a paced
producer sends records with ``delay.ms`` = 1000 at R records/s to a second target. After
``periods`` periods every schedule is cancelled, and both targets are read back:

* firing lateness = record timestamp - ``delay.deliver-at`` (the firing's nominal time):
  p50 / p99 / p99.9 / max over the firings of the measured window (from the second period on:
  the first firings of a schedule produced late are due while the preload is still running);
* early: firings before their nominal time (must be 0);
* missed: nominal times of the window (start_i + k * P, up to one period before the cancels)
  with no firing, and not covered by a later firing's ``delay.missed`` (a firing stamped D with
  ``delay.missed`` m stands for the m nominal times before D); doubled: nominal times fired
  twice (same ``delay.id`` and ``delay.deliver-at``); both must be 0 without kills;
* with kills (K SIGKILLs, evenly spread over the window, the sidecar restarted at once on its
  data directory each time): missed must still be 0, and a doubled firing is allowed only for a
  firing in flight at a kill: its first copy written within ``IN_FLIGHT_MS`` before a kill
  (``doubled_not_in_flight``, goal 0). The lateness is reported over all the window's firings
  and, beside it, over those not due while a restart was under way (from each kill until
  ``RECOVERY_MS`` after the restarted sidecar had its partition again);
* the 1 s stream's lateness p99 (goal: the firings do not make it late);
* CPU per firing settled in the window (without kills): the sidecar process's (librdkafka's
  threads included) and its loop thread's alone, with the seconds the loop thread waited for a
  CPU (the machine's other load);
* exactly-once (``--delivery exactly-once`` alone): the sidecar runs with it, the targets are
  read ``read_committed`` as always, and no nominal time may be seen twice, kills or not
  (``doubled``, goal 0);
* memory per schedule: the sidecar's anonymous RSS after every schedule is stored, minus before
  the preload, over N (the RSS total beside it counts mapped store pages too); and the same once
  the store is opened by a fresh process (a graceful restart before the first firing), without
  the intake's high-water marks: the goal's figure, as ``pending-memory``'s ``reopened``.

Sizes: full 1,000,000 schedules every 60 s (16.7k firings/s, the issue's goal), 3 periods, the
stream at 1,000/s, 10 kills; small 3,000 every 10 s (300 firings/s), 3 periods, the stream at
200/s, no kill. ``--recurring-schedules``, ``--recurring-period`` and ``--recurring-kills`` set
N, P and K at either size (the preload runs at about 50k records/s; the bench waits for it).
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from typing import Any

from bench.report import fig
from bench.workload import (
    Bench,
    Delivered,
    PacedProducer,
    SidecarProc,
    cpu_seconds,
    lateness_percentiles,
    log,
    preload,
    producer,
    read_range,
    rss_of,
    schedstat,
    sleep_until_wall_ms,
    uid,
    wait_until,
    wall_ms,
)
from sidecar import contract as c

GOAL_P99_MS = "<= 50"
IN_FLIGHT_MS = 5_000  # a firing written this long before a kill may be in flight (not settled) at it
STORE_US_PER_SCHEDULE = 100  # the preload's wait: see measure
RECOVERY_MS = 5_000  # after a restart: the firings due meanwhile are late by the restart, not by the path


def params(bench: Bench) -> tuple[int, int, int, float, int]:
    """(schedules, period ms, periods, 1 s stream rate, kills); the size's, or the flags'."""
    n, period_ms, periods, rate, kills = (1_000_000, 60_000, 3, 1_000.0, 10) if bench.full else (
        3_000, 10_000, 3, 200.0, 0)
    o = bench.options
    return (o.get("recurring_schedules") or n, o.get("recurring_period_ms") or period_ms, periods, rate,
            kills if o.get("recurring_kills") is None else int(o["recurring_kills"]))


def measure(bench: Bench, scheduler: str, n: int, period_ms: int, periods: int, rate: float,
            kills: int = 0) -> dict[str, Any]:
    ingress, target, stream_target = f"bench.rec.in.{uid()}", f"bench.rec.out.{uid()}", f"bench.rec.s.{uid()}"
    bench.topics(ingress, target, stream_target)
    sc = bench.sidecar(ingress, scheduler, tag="rec", delivery=bench.other_delivery)
    sc.start()
    stream: PacedProducer | None = None
    try:
        anon0, rss0 = rss_of(sc.pid)
        cpu0 = cpu_seconds(sc.pid)
        # the first firings after the preload: the bench's schedules (delay.every and delay.start) are
        # stored by the C intake, ~20,000 a second on a loaded 2-core machine (the producer's pace);
        # 10,000 a second is assumed, and stored_after_first_firing_ms says if that (and the restart
        # below) was not enough
        fill0 = wall_ms()
        t0 = fill0 + 15_000 + n * STORE_US_PER_SCHEDULE // 1000  # (15 s: the restart below too)
        starts = [t0 + i * period_ms // n for i in range(n)]
        pre = preload(bench.bootstrap, ingress, n, 100, target, lambda _i: 0, key_prefix="s",
                      schedule=lambda i: [(c.ID, b"sched-%d" % i), (c.EVERY, b"%d" % period_ms),
                                          (c.START, b"%d" % starts[i])])
        wait_until(f"{n} schedules stored", lambda: sc.counter("ingested") >= n, 300, 0.2, sc.check_alive)
        anon1, rss1 = rss_of(sc.pid)
        stored_ms = wall_ms()
        store_cpu_us = (cpu_seconds(sc.pid) - cpu0) * 1e6 / n
        # the same store opened by a fresh process (a graceful restart): without the intake's
        # high-water marks (librdkafka's fetch queue of up to 64 MiB, the changelog's producer
        # queue, the allocator's arenas), what N schedules cost a running sidecar (pending-memory's
        # ``reopened``)
        sc.stop()
        sc.start()
        time.sleep(2)
        anon2, rss2 = rss_of(sc.pid)
        ready_ms = wall_ms()
        log(f"recurring {scheduler}: {n:,} schedules produced in {pre.seconds:.1f} s, stored after "
            f"{(stored_ms - fill0) / 1000:.1f} s ({store_cpu_us:.1f} us sidecar CPU each), "
            f"{(anon1 - anon0) / n:.1f} B anon each, {(anon2 - anon0) / n:.1f} B once reopened")
        stream = PacedProducer(bench.bootstrap, ingress, stream_target, rate, 100, lambda _i: 1_000)
        stream.start()
        cpu1, fired1 = cpu_seconds(sc.pid), sc.counter("fired")
        loop1 = schedstat(sc.pid)
        end = t0 + periods * period_ms
        restarts = kill_between(sc, scheduler, kills, max(t0, ready_ms) + period_ms // 2, end - period_ms // 2)
        sleep_until_wall_ms(end)
        fired2 = sc.counter("fired")
        # the loop's whole CPU (the 1 s stream's records too) per firing settled; a kill restarts the count
        fire_cpu_us = (cpu_seconds(sc.pid) - cpu1) * 1e6 / max(1, fired2 - fired1) if not kills else None
        # the loop thread's alone (librdkafka's threads not counted), and how long it waited for a CPU
        loop2 = schedstat(sc.pid)
        loop_cpu_us = (loop2[0] - loop1[0]) * 1e6 / max(1, fired2 - fired1) if not kills else None
        loop_wait_s = loop2[1] - loop1[1] if not kills else None
        stream.stop()
        cancel_all(bench, ingress, n)
        wait_until("the 1 s stream delivered", lambda: bench.wm.total(stream_target) >= stream.accepted,
                   60, 0.25, sc.check_alive)
        sleep_until_wall_ms(wall_ms() + 2_000)  # firings in flight at the cancels
        stats = sc.stats() or {}
    finally:
        if stream is not None:
            stream.stop()
        sc.poll_events()
        sc.stop()
    got = read_range(bench.bootstrap, target, {}, bench.wm.high(target), headers=True)
    acc = account(got, starts, period_ms, (t0 + period_ms, end - period_ms), restarts)
    s = read_range(bench.bootstrap, stream_target, {}, bench.wm.high(stream_target), headers=True)
    stream_late = [ts - da for ts, da in zip(s.ts, s.deliver_at, strict=True)]
    return {
        "schedules": n, "period_ms": period_ms, "periods": periods, "delivery": bench.other_delivery,
        "firings": len(got.ts), "firings_per_s": n * 1000 / period_ms,
        "stored_after_first_firing_ms": max(0, ready_ms - t0),
        "store_s": (stored_ms - fill0) / 1000, "store_cpu_us_per_schedule": store_cpu_us,
        "fire_cpu_us_per_firing": fire_cpu_us, "loop_cpu_us_per_firing": loop_cpu_us,
        "loop_waited_for_cpu_s": loop_wait_s, **acc,
        "kills": kills, "restart_ms": [r - k for k, r in restarts],
        "delay_missed_total": sum(got.missed), "stream_rate": rate, "stream_records": len(s.ts),
        "stream_lateness_ms": lateness_percentiles(stream_late),
        "stream_early": sum(1 for x in stream_late if x < 0),
        "anon_bytes_per_schedule": (anon1 - anon0) / n, "rss_bytes_per_schedule": (rss1 - rss0) / n,
        "anon_bytes_per_schedule_reopened": (anon2 - anon0) / n, "rss_bytes_per_schedule_reopened": (rss2 - rss0) / n,
        "sidecar_missed": int(stats.get("missed", 0)), "sidecar_fired": int(stats.get("fired", 0)),
    }


def kill_between(sc: SidecarProc, scheduler: str, kills: int, first_ms: int, last_ms: int) -> list[tuple[int, int]]:
    """SIGKILL ``sc`` ``kills`` times evenly between wall times ``first_ms`` and ``last_ms``,
    restarting it at once on its data directory each time; return (kill ms, partitions assigned
    again ms) of each."""
    restarts: list[tuple[int, int]] = []
    for k in range(kills):
        sleep_until_wall_ms(first_ms + (k + 1) * max(0, last_ms - first_ms) // (kills + 1))
        killed = wall_ms()
        sc.stop(signal.SIGKILL)
        sc.start()
        restarts.append((killed, wall_ms()))
        log(f"recurring {scheduler}: kill {k + 1}/{kills}, partition assigned again after "
            f"{restarts[-1][1] - killed} ms")
    return restarts


def cancel_all(bench: Bench, ingress: str, n: int) -> None:
    """Cancel the bench's schedules ``sched-0`` .. ``sched-<n-1>`` (keyed as they were sent)."""
    p = producer(bench.bootstrap)
    for i in range(n):
        p.produce(ingress, key=b"s%d" % i, value=None, headers=[(c.CANCEL, b"sched-%d" % i)])
        if i % 10_000 == 0:
            p.poll(0)
    p.flush(120)


def account(got: Delivered, starts: list[int], period_ms: int, window: tuple[int, int],
            restarts: list[tuple[int, int]]) -> dict[str, Any]:
    """The firings read back (``got``, with headers) against the nominal times of schedule i
    (``sched-<i>``: ``starts[i] + k * period_ms``) in ``window`` (inclusive), with the kills
    ``restarts`` ((kill ms, back ms) each): lateness, early, missed, doubled (module docstring)."""
    window_from, window_to = window
    in_window = [i for i, da in enumerate(got.deliver_at) if window_from <= da <= window_to]
    late = [got.ts[i] - got.deliver_at[i] for i in in_window]
    calm = [got.ts[i] - got.deliver_at[i] for i in in_window
            if not any(k <= got.deliver_at[i] <= r + RECOVERY_MS for k, r in restarts)]
    early = sum(1 for ts, da in zip(got.ts, got.deliver_at, strict=True) if ts < da)
    fired = Counter(zip(got.ids, got.deliver_at, strict=True))
    first_ts: dict[tuple[bytes, int], int] = {}
    covered: set[tuple[bytes, int]] = set()
    for rid, da, ts, m in zip(got.ids, got.deliver_at, got.ts, got.missed, strict=True):
        first_ts[rid, da] = min(ts, first_ts.get((rid, da), ts))
        covered.update((rid, da - j * period_ms) for j in range(1, m + 1))
    missed = 0
    for i, start in enumerate(starts):
        rid = b"sched-%d" % i
        t = start
        while t <= window_to:
            if t >= window_from and (rid, t) not in fired and (rid, t) not in covered:
                missed += 1
            t += period_ms
    return {
        "lateness_ms": lateness_percentiles(late), "lateness_outside_restarts_ms": lateness_percentiles(calm),
        "early": early, "missed": missed, "doubled": sum(k - 1 for k in fired.values()),
        "doubled_not_in_flight": sum(k - 1 for key, k in fired.items() if k > 1 and not any(
            kill - IN_FLIGHT_MS <= first_ts[key] <= kill for kill, _r in restarts)),
    }


def run(bench: Bench) -> dict[str, Any]:
    n, period_ms, periods, rate, kills = params(bench)
    results: dict[str, Any] = {}
    details: dict[str, Any] = {}
    for sched in bench.schedulers:
        m = measure(bench, sched, n, period_ms, periods, rate, kills)
        lat, slat = m["lateness_ms"], m["stream_lateness_ms"]
        log(f"recurring {sched}: {m['firings']:,} firings, lateness p99 {lat['p99']} ms "
            f"(outside restarts {m['lateness_outside_restarts_ms']['p99']}), early {m['early']}, "
            f"missed {m['missed']}, doubled {m['doubled']} ({m['doubled_not_in_flight']} not in flight, "
            f"{kills} kills, {m['delivery']}); 1 s stream p99 {slat['p99']} ms; "
            f"{m['anon_bytes_per_schedule']:.1f} B anon/schedule; "
            f"sidecar CPU per firing {m['fire_cpu_us_per_firing']} us, its loop thread's "
            f"{m['loop_cpu_us_per_firing']} us (waited {m['loop_waited_for_cpu_s']} s for a CPU)")
        results[sched] = {
            "firing_lateness_p99_ms": fig(lat["p99"], "ms", GOAL_P99_MS),
            "firing_lateness_p999_ms": fig(lat["p999"], "ms"),
            "firing_lateness_max_ms": fig(lat["max"], "ms"),
            "early": fig(m["early"], "records", "== 0"),
            "missed": fig(m["missed"], "firings", "== 0"),
            "doubled": fig(m["doubled"], "firings", "== 0" if not kills or m["delivery"] == "exactly-once" else None),
            "doubled_not_in_flight": fig(m["doubled_not_in_flight"], "firings", "== 0"),
            "kills": fig(kills, "SIGKILLs"),
            "firing_lateness_outside_restarts_p99_ms": fig(m["lateness_outside_restarts_ms"]["p99"], "ms"),
            "stream_lateness_p99_ms": fig(slat["p99"], "ms"),
            "anon_bytes_per_schedule": fig(m["anon_bytes_per_schedule"], "B"),
            "anon_bytes_per_schedule_reopened": fig(m["anon_bytes_per_schedule_reopened"], "B", "<= 8"),
        }
        details[sched] = m
    return {"method": __doc__, "results": results, "details": details}
